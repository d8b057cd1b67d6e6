"""Write a tiny random Qwen2-, Qwen3- or Llama-style Hugging Face model directory, with a character-level tokenizer.

The directory holds ``config.json``, ``model.safetensors`` and a ``tokenizers`` WordLevel tokenizer over single
characters with exactly the ids of :class:`sc_lightning.tokenizer.CharTokenizer` (pad 0, eos 1, bos 2, then
``"0123456789+-*= "``), so ``transformers.AutoModelForCausalLM`` / ``AutoTokenizer`` and
``sc_lightning.tokenizer.load_tokenizer(path)`` all load it. Nothing is downloaded. Norms and biases are random
too (not 1 and 0), so conversion tests exercise them.

    python examples/make_tiny_model.py /tmp/tiny-qwen2 --arch qwen2 --seed 0
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from sc_lightning.models.convert import random_hf_state
from sc_lightning.models.hf_config import ARCHITECTURES, QKV_BIAS, hf_config_dict
from sc_lightning.models.spec import BUILTIN_SPECS, ModelSpec
from sc_lightning.models.tiny_tokenizer import save_char_tokenizer
from sc_lightning.tokenizer import CharTokenizer


def tiny_spec(arch: str = "qwen2", **overrides: Any) -> ModelSpec:
    """The ``builtin:tiny`` architecture as a Qwen2 (q/k/v biases), Qwen3 (QK-norm) or Llama model, with
    ``overrides``."""
    if arch not in ARCHITECTURES.values():
        raise ValueError(f"arch must be one of {sorted(ARCHITECTURES.values())}, got {arch!r}")
    base = BUILTIN_SPECS["builtin:tiny"].replace(arch=arch, qkv_bias=QKV_BIAS[arch])
    return base.replace(**overrides)


def _randomise_norms_and_biases(state: dict[str, torch.Tensor], seed: int) -> None:
    """Move norms away from 1 and biases away from 0, in place, so a converter that drops them is caught."""
    gen = torch.Generator().manual_seed(seed + 1)
    for name, tensor in state.items():
        if name.endswith("norm.weight"):
            tensor.copy_(1.0 + 0.1 * torch.randn(tensor.shape, generator=gen))
        elif name.endswith(".bias"):
            tensor.copy_(0.1 * torch.randn(tensor.shape, generator=gen))


def make_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    arch: str = "qwen2",
    tie_word_embeddings: bool = False,
    weight_std: float = 0.15,
    **spec_overrides: Any,
) -> Path:
    """Write a tiny random ``arch`` model + char tokenizer to ``path`` (created); returns ``path``.

    ``spec_overrides`` change :class:`ModelSpec` fields of the tiny architecture (e.g. ``num_layers=3``).
    ``weight_std`` scales the random matrices (large enough that logits are far from uniform).
    """
    from safetensors.torch import save_file
    from transformers import AutoConfig

    spec = tiny_spec(arch, tie_word_embeddings=tie_word_embeddings, **spec_overrides)
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    tok = CharTokenizer()
    config = hf_config_dict(spec, pad_token_id=tok.PAD, eos_token_id=tok.EOS, bos_token_id=tok.BOS)
    AutoConfig.for_model(**config).save_pretrained(str(root))
    state = random_hf_state(spec, seed)
    for name, tensor in state.items():
        if not name.endswith(("norm.weight", ".bias")):
            tensor.mul_(weight_std / 0.02)
    _randomise_norms_and_biases(state, seed)
    save_file({k: v.contiguous() for k, v in state.items()}, str(root / "model.safetensors"), metadata={"format": "pt"})
    save_char_tokenizer(root, model_max_length=spec.max_position_embeddings)
    return root


def main() -> None:
    """Command line: ``make_tiny_model.py PATH [--arch qwen2|qwen3|llama] [--seed N] [--tied]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES.values()), default="qwen2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tied", action="store_true", help="tie the input embedding and the LM head")
    args = parser.parse_args()
    print(make_tiny_model(args.path, seed=args.seed, arch=args.arch, tie_word_embeddings=args.tied))


if __name__ == "__main__":
    main()
