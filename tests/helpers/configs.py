"""The repository, the shipped tiny config and the tests' base config, as paths and as raw data."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from sc_lightning.config.yaml_io import load_yaml_layers, merge_into

REPO = Path(__file__).resolve().parents[2]
TINY = "configs/grpo_tiny.yaml"  # relative to REPO, the working directory of the tests' commands (tests/helpers/cli.py)
TINY_PATH = REPO / TINY
# The tests' base config: the shipped tiny config, colocated and synchronous, at 4 groups x 4 generations per step.
TEST_BASE = (TINY_PATH, REPO / "configs" / "colocated.yaml", REPO / "tests" / "small_steps.yaml")


def tiny_raw() -> dict[str, Any]:
    """The tests' base config (the TEST_BASE layers merged) as plain data."""
    return load_yaml_layers(TEST_BASE)


def variant(*layers: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tiny config (or ``base``) with ``layers`` deep-merged on top, like repeated --config files."""
    raw = copy.deepcopy(base if base is not None else tiny_raw())
    for layer in layers:
        merge_into(raw, layer)
    return raw
