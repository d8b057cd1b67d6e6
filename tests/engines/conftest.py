"""Fixtures for the engine tests: megatron's parallel state and tiny HF model directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.models import make_tiny_model


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny random Qwen2 HF model directories with different weights (``a`` and ``b``), a Llama and a Qwen3
    (QK-norm) one."""
    root = tmp_path_factory.mktemp("engine_models")
    return {
        "a": make_tiny_model(root / "a", seed=0, arch="qwen2"),
        "b": make_tiny_model(root / "b", seed=1, arch="qwen2"),
        "llama": make_tiny_model(root / "llama", seed=2, arch="llama", tie_word_embeddings=True),
        "qwen3": make_tiny_model(root / "qwen3", seed=3, arch="qwen3", tie_word_embeddings=True),
    }
