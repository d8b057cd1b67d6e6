"""Fixtures for the engine tests: megatron's parallel state and tiny HF model directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.models import load_make_tiny_model


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny random Qwen2 HF model directories with different weights (``a`` and ``b``), and a Llama one."""
    root = tmp_path_factory.mktemp("engine_models")
    make = load_make_tiny_model()
    return {
        "a": make(root / "a", seed=0, arch="qwen2"),
        "b": make(root / "b", seed=1, arch="qwen2"),
        "llama": make(root / "llama", seed=2, arch="llama", tie_word_embeddings=True),
    }
