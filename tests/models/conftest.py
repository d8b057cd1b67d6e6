"""Fixtures for the model-layer tests: one megatron parallel state per process, tiny HF model directories."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.helpers.models import load_make_tiny_model

make_tiny_model: Callable[..., Path] = load_make_tiny_model()

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
}


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random HF model directories, one per TINY_VARIANTS entry."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        name: make_tiny_model(root / name, seed=i, arch=arch, tie_word_embeddings=tied, **extra)
        for i, (name, (arch, tied, extra)) in enumerate(TINY_VARIANTS.items())
    }


def hf_causal_lm(path: Path) -> torch.nn.Module:
    """transformers' own model of ``path``: fp32, eager attention, eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32).eval()


def random_ids(batch: int, length: int, seed: int = 0, vocab: int = 18) -> torch.Tensor:
    """Seeded random token ids ``(batch, length)``."""
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
