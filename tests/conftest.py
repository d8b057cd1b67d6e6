"""Shared helpers: the tiny config as raw data, and a way to build variants of it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from sc_lightning.config.yaml_io import merge_into, read_yaml_file

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "grpo_tiny.yaml"


def tiny_raw() -> dict[str, Any]:
    """The shipped tiny config as plain data."""
    return read_yaml_file(TINY)


def variant(*layers: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tiny config (or ``base``) with ``layers`` deep-merged on top, like repeated --config files."""
    raw = copy.deepcopy(base if base is not None else tiny_raw())
    for layer in layers:
        merge_into(raw, layer)
    return raw


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO
