"""The Hugging Face export writer: a built-in model (no source directory) becomes a ``Qwen2ForCausalLM`` directory
with the character tokenizer that ``transformers`` runs with the same logits; shards, sizes and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sc_lightning.cli.args import UsageError
from sc_lightning.cli.export import parse_size
from sc_lightning.models import build_gpt_model, export_hf_weights
from sc_lightning.models.convert import read_hf_safetensors
from sc_lightning.models.hf_export import ExportError, PolicySource, check_output_dir, write_hf_export
from sc_lightning.models.logprobs import logits_of
from sc_lightning.models.spec import builtin_spec
from sc_lightning.trainer.bundle_policy import policy_source_of
from tests.helpers.exports import transformers_logits

SPEC = builtin_spec("builtin:tiny")


def test_a_builtin_policy_exports_as_qwen2_with_the_character_tokenizer(tmp_path: Path, model_parallel) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from sc_lightning.tokenizer import CharTokenizer

    model = build_gpt_model(SPEC, seed=3)
    source = PolicySource("builtin:tiny", None, "fp32", SPEC)
    with torch.no_grad():
        write_hf_export(tmp_path / "out", source, export_hf_weights(model, SPEC), max_shard_bytes=10_000)
    ids = torch.tensor([[2, 4, 13, 5, 16, 8]])  # <s>1+2=5
    with torch.no_grad():
        ours = logits_of(model, ids, vocab_size=SPEC.vocab_size)
    torch.testing.assert_close(transformers_logits(tmp_path / "out", ids), ours, rtol=0, atol=1e-4)
    config = AutoConfig.from_pretrained(str(tmp_path / "out"))
    assert config.architectures == ["Qwen2ForCausalLM"] and config.eos_token_id == CharTokenizer.EOS
    tokenizer, ours_tok = AutoTokenizer.from_pretrained(str(tmp_path / "out")), CharTokenizer()
    for text in ("12+34=46", "7 * 8 = 56"):
        assert tokenizer.encode(text, add_special_tokens=False) == ours_tok.encode(text)
        assert tokenizer.decode(ours_tok.encode(text)) == text
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()  # 10 KB shards
    assert not list(tmp_path.glob(".out.tmp-*"))  # staged beside it, renamed into place


def test_an_output_that_is_not_empty_is_refused_and_an_empty_one_is_used(tmp_path: Path, model_parallel) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="taken exists and is not an empty directory; export to a new path"):
        check_output_dir(tmp_path / "taken")
    (tmp_path / "empty").mkdir()
    model = build_gpt_model(SPEC, seed=3)
    source = PolicySource("builtin:tiny", None, "fp32", SPEC)
    write_hf_export(tmp_path / "empty", source, export_hf_weights(model, SPEC))
    assert read_hf_safetensors(tmp_path / "empty").keys() == {n for n, _ in export_hf_weights(model, SPEC)}


def test_the_policy_source_round_trips_and_its_absence_names_the_fix(tmp_path: Path) -> None:
    source = PolicySource("/models/qwen", "builtin:char", "bf16", SPEC)
    assert PolicySource.from_dict(source.to_dict()) == source
    with pytest.raises(ExportError, match="give the run's config with --config"):
        policy_source_of({"state_dict": {}}, tmp_path / "trainer.ckpt", None)
    assert policy_source_of({}, tmp_path / "trainer.ckpt", source) is source


@pytest.mark.parametrize(
    ("text", "size"), [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("20KiB", 20480), ("1234", 1234), ("1.5kb", 1500)]
)
def test_shard_sizes_read_as_transformers_writes_them(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "5 GBs", "-1MB", "big"])
def test_a_bad_shard_size_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="--max_shard_size takes a positive size"):
        parse_size(text)
