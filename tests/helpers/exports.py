"""Checks of a Hugging Face export against the bundle it came from: ``transformers``' logits of the export equal the
project's own forward of the bundle's policy (fp32), and its tokenizer encodes and decodes as the source's does."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

PROBE = torch.tensor([[5, 17, 42, 99, 3, 200, 7, 64, 128, 31], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
"""Token ids the logits are compared on (every HF test model has more than 256: its byte alphabet)."""


def transformers_logits(model_dir: Path, input_ids: torch.Tensor = PROBE) -> torch.Tensor:
    """``(B, T, vocab)`` fp32 logits of the directory's model as ``transformers`` loads and runs it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids).logits.float()


def bundle_logits(trainer_checkpoint: Path, input_ids: torch.Tensor = PROBE) -> torch.Tensor:
    """``(B, T, vocab)`` fp32 logits of the bundle's policy, run by the project's own (megatron-core) forward."""
    from sc_lightning.models.logprobs import logits_of
    from sc_lightning.trainer.bundle_policy import load_bundle_policy

    model, source = load_bundle_policy(trainer_checkpoint)
    with torch.no_grad():
        return logits_of(model, input_ids, vocab_size=source.spec.vocab_size)


def assert_export_matches_bundle(export_dir: Path, trainer_checkpoint: Path, source_dir: Path) -> None:
    """The export's ``transformers`` logits equal the bundle's own forward (atol 1e-4), and differ from the source
    directory's: the export holds the trained weights, not the ones training started from."""
    exported = transformers_logits(export_dir)
    torch.testing.assert_close(exported, bundle_logits(trainer_checkpoint), rtol=0, atol=1e-4)
    assert not torch.allclose(exported, transformers_logits(source_dir), rtol=0, atol=1e-4)


def assert_tokenizer_round_trips(export_dir: Path, source_dir: Path, texts: Iterable[str]) -> None:
    """The export's tokenizer gives the source's ids, special tokens and chat template, and decodes ``texts`` back."""
    from transformers import AutoTokenizer

    exported, source = AutoTokenizer.from_pretrained(str(export_dir)), AutoTokenizer.from_pretrained(str(source_dir))
    assert exported.chat_template == source.chat_template
    assert exported.all_special_tokens == source.all_special_tokens
    for text in texts:
        ids = exported.encode(text, add_special_tokens=False)
        assert ids == source.encode(text, add_special_tokens=False), text
        assert exported.decode(ids) == text
