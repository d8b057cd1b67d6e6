"""Fixtures for the model-layer tests: tiny HF model directories, one per variant the parity tests cover."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.models import TINY_VARIANTS, make_tiny_model


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random HF model directories, one per TINY_VARIANTS entry."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        name: make_tiny_model(root / name, seed=i, arch=arch, tie_word_embeddings=tied, **extra)
        for i, (name, (arch, tied, extra)) in enumerate(TINY_VARIANTS.items())
    }
