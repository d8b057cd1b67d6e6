"""Checkpoints written by an older sc_lightning resume through a migration, and newer ones are refused, through the
CLI: a bundle whose data-plane rows predate per-token versions (format 1, no ``token_versions``) resumes with the
same command and trains every prompt exactly once; one whose rows are of a newer format exits 3 naming the version
before anything starts. The migration itself, row by row and on both backends: tests/data_plane/test_contract.py.
Real CLI, megatron-core policy, Megatron engine, controller and data plane."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sc_lightning.checkpoint.bundle import DATA_PLANE_DIR, bundle_name
from sc_lightning.cli.exits import EXIT_CANNOT_RESUME
from sc_lightning.data_plane.snapshot_files import ROWS_FILE
from tests.helpers.cli import run
from tests.helpers.configs import REPO, TINY_PATH
from tests.helpers.old_formats import as_version_1_snapshot, restamp_bundle, set_manifest_version
from tests.helpers.recovery import assert_history_exactly_once, one_ahead_with_a_bundle_per_step

pytestmark = pytest.mark.slow

GROUPS = 4
HOLDS_ROWS = '--trainer.callbacks=[{"class_path": "tests.helpers.callbacks.BundleHoldsABufferedGroup"}]'
"""Each bundle's cut waits for a buffered group, so the bundles hold rows (whether one is committed by then is a
race)."""


def fit(tmp_path: Path, steps: int) -> tuple[int, str]:
    """The one command, one version ahead with a buffer of two steps and bundles holding rows, to ``steps`` steps."""
    done = run(
        "fit",
        "--config", str(TINY_PATH), "--config", str(REPO / "configs" / "samplers" / "in_order.yaml"),
        "--config", str(REPO / "tests" / "small_steps.yaml"),
        *one_ahead_with_a_bundle_per_step(tmp_path, steps, GROUPS),
        HOLDS_ROWS,
    )  # fmt: skip
    return done.returncode, done.stderr


def rows_in(bundle: Path) -> int:
    """How many data-plane rows ``bundle`` holds."""
    return len(torch.load(bundle / DATA_PLANE_DIR / ROWS_FILE, weights_only=True)["keys"])


def test_a_bundle_from_before_per_token_versions_resumes_exactly_once(tmp_path: Path) -> None:
    code, stderr = fit(tmp_path, steps=3)
    assert code == 0, stderr[-3000:]
    bundle = tmp_path / "checkpoints" / bundle_name(3)
    assert rows_in(bundle) > 0, "the bundle must hold buffered rows for the migration to matter"
    as_version_1_snapshot(bundle / DATA_PLANE_DIR)
    restamp_bundle(bundle)

    code, stderr = fit(tmp_path, steps=6)
    assert code == 0, stderr[-3000:]
    assert f"resuming from {bundle}" in stderr
    assert_history_exactly_once(tmp_path, steps=6)


def test_a_bundle_with_rows_of_a_newer_format_exits_3_naming_it(tmp_path: Path) -> None:
    code, stderr = fit(tmp_path, steps=2)
    assert code == 0, stderr[-3000:]
    bundle = tmp_path / "checkpoints" / bundle_name(2)
    set_manifest_version(bundle / DATA_PLANE_DIR, 7)
    restamp_bundle(bundle)

    code, stderr = fit(tmp_path, steps=4)
    assert code == EXIT_CANNOT_RESUME, stderr[-3000:]
    assert "data-plane snapshot of format version 7; this sc_lightning reads versions 1, 2" in stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "checkpoints" / bundle_name(3)).exists(), "refused before training"
