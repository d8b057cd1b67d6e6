"""Fixtures for the engine tests: megatron's parallel state and tiny HF model directories."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _make_tiny_model() -> Callable[..., Path]:
    """``make_tiny_model`` of examples/make_tiny_model.py (examples/ is not a package)."""
    name = "sc_lightning_examples_make_tiny_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "examples" / "make_tiny_model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].make_tiny_model


@pytest.fixture(scope="session")
def model_parallel() -> None:
    """torch.distributed (gloo, world of one) and megatron's parallel state at TP=1, once per process."""
    from sc_lightning.models.megatron import init_model_parallel

    init_model_parallel(1)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny random Qwen2 HF model directories with different weights (``a`` and ``b``), and a Llama one."""
    root = tmp_path_factory.mktemp("engine_models")
    make = _make_tiny_model()
    return {
        "a": make(root / "a", seed=0, arch="qwen2"),
        "b": make(root / "b", seed=1, arch="qwen2"),
        "llama": make(root / "llama", seed=2, arch="llama", tie_word_embeddings=True),
    }
