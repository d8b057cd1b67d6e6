"""Tiny HF models for the model-layer and engine tests: written to disk as a user's ``make_tiny_model.py`` writes
them, the variants the parity tests cover, transformers' own model of one, and seeded token ids."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tests.helpers.configs import REPO

# (arch, tied embeddings, extra ModelSpec overrides): the HF model directories the parity tests cover.
TINY_VARIANTS: dict[str, tuple[str, bool, dict]] = {
    "qwen2": ("qwen2", False, {}),
    "qwen2-tied": ("qwen2", True, {}),
    "llama": ("llama", False, {}),
    "llama-tied": ("llama", True, {}),
    "llama3-rope-mqa": (
        "llama",
        True,
        {"rope_theta": 5e5, "rope_scaling_factor": 32.0, "num_query_groups": 1, "max_position_embeddings": 16384},
    ),
    "qwen2-vocab19": ("qwen2", False, {"vocab_size": 19}),
    "qwen3": ("qwen3", False, {}),
    "qwen3-tied-gqa": ("qwen3", True, {"num_attention_heads": 4, "head_dim": 32}),
}


def _example() -> ModuleType:
    """examples/make_tiny_model.py as a module (examples/ is not a package), loaded once."""
    name = "sc_lightning_examples_make_tiny_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "examples" / "make_tiny_model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def make_tiny_model(path: str | Path, **knobs: Any) -> Path:
    """A tiny random HF model directory at ``path``, by examples/make_tiny_model.py's ``make_tiny_model``."""
    return _example().make_tiny_model(path, **knobs)


def hf_causal_lm(path: Path) -> torch.nn.Module:
    """transformers' own model of ``path``: fp32, eager attention, eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32).eval()


def random_ids(batch: int, length: int, seed: int = 0, vocab: int = 18) -> torch.Tensor:
    """Seeded random token ids ``(batch, length)``."""
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
