"""Fixtures for the model-layer tests: tiny HF model directories, one per variant the parity tests cover."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.hf_models import HF_ARCHITECTURES, make_hf_model_dir
from tests.helpers.models import TINY_VARIANTS, make_tiny_model


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random HF model directories, one per TINY_VARIANTS entry, and one per HF_ARCHITECTURES entry written by
    transformers itself (``hf-<name>``, with a BPE tokenizer)."""
    root = tmp_path_factory.mktemp("tiny_models")
    ours = {
        name: make_tiny_model(root / name, seed=i, arch=arch, tie_word_embeddings=tied, **extra)
        for i, (name, (arch, tied, extra)) in enumerate(TINY_VARIANTS.items())
    }
    theirs = {
        f"hf-{name}": make_hf_model_dir(root / f"hf-{name}", name, seed=i) for i, name in enumerate(HF_ARCHITECTURES)
    }
    return ours | theirs
