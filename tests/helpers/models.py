"""The tiny model of the shipped examples, written to disk as a user's ``make_tiny_model.py`` writes it."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from tests.helpers.configs import REPO


def load_make_tiny_model() -> Callable[..., Path]:
    """``make_tiny_model`` of examples/make_tiny_model.py (examples/ is not a package), loaded once."""
    name = "sc_lightning_examples_make_tiny_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "examples" / "make_tiny_model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].make_tiny_model
