"""Every sampler mode resumes with the same command, through the CLI, from its newest bundle and from a rollout
snapshot, and the history in ``train_data.jsonl`` trains every prompt at most once, in whole groups.

A shipped mode runs its overlay from ``configs/samplers/`` (so each shipped file is loaded and trained here, and no
step lags more than its one version). Each mode runs one version ahead with a buffer of two steps (colocated engine
and in-process data plane, so no Ray and quick runs), so the pump holds dispatched groups — and, for the ungated
windowed and custom modes, a batch waiting for buffer permits — when a checkpoint is cut. Per mode: 2 steps; then
the same command resumes from the ``step_2`` bundle (its rollout snapshots removed) and runs to step 6 taking
rollout snapshots; then the bundles newer than the newest snapshot's anchor are removed (a crash before they were
renamed) and the same command resumes from that snapshot and runs to step 7. A snapshot lands only while the
trainer's version has its bundle and the next refit has not begun (about one train step): four such windows, small
micro-batches that widen them and an attempt every 20 ms make one land in practice (two windows of quick steps, or
attempts every 100 ms on a fast machine, missed now and then).
Real CLI, megatron-core policy, Megatron engine, controller and data plane.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from sc_lightning.checkpoint.atomic import complete_bundles
from sc_lightning.checkpoint.snapshots import SNAPSHOTS_DIR, snapshot_dirs
from tests.helpers.cli import run
from tests.helpers.configs import REPO, TINY_PATH
from tests.helpers.recovery import assert_history_exactly_once, one_ahead_with_a_bundle_per_step

pytestmark = pytest.mark.slow

GROUPS, GENERATIONS = 4, 4
SHIPPED_MODES = ("in_order", "weight_fifo", "ready_first", "windowed")
SAMPLERS = {
    # a shipped mode runs its overlay (configs/samplers/, one version of lag each) under the shape below
    **{mode: ["--config", str(REPO / "configs" / "samplers" / f"{mode}.yaml")] for mode in SHIPPED_MODES},
    "custom": [
        "--async_rl.sampler", "{name: custom}",
        "--async_rl.sampler.target", "tests.controller.custom:LatestOnly",
        "--async_rl.sampler.init_args", "{keep: 1}",
    ],
}  # fmt: skip


def fit(tmp_path: Path, sampler: str, steps: int) -> str:
    """Run the mode's one command to ``steps`` steps; its stderr (the run must succeed)."""
    done = run(
        "fit",
        "--config", str(TINY_PATH), *SAMPLERS[sampler], "--config", str(REPO / "tests" / "small_steps.yaml"),
        *one_ahead_with_a_bundle_per_step(tmp_path, steps, GROUPS),
        "--rollout_checkpointing.snapshot_attempt_interval_s", "0.02",
        "--policy.train_micro_batch_size", "2",  # longer train steps: wider windows for a snapshot to land
        "--token_capture.enabled", "true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def resumed_from(stderr: str) -> str:
    """The restore point a run reported."""
    lines = [line for line in stderr.splitlines() if line.startswith("resuming from")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def assert_lag_within_the_modes_bound(tmp_path: Path, sampler: str) -> None:
    """Every logged step trained groups no newer than the trainer and at most one version behind it (each mode's
    bound), but with ready_first: it trains a straggler however late it comes (nothing is evicted, docs/samplers.md),
    so a group in flight across two refits is trained two versions behind."""
    for log in tmp_path.glob("lightning_logs/version_*/metrics.csv"):
        with log.open() as handle:
            lags = [float(row["train/staleness_max"]) for row in csv.DictReader(handle) if row["train/reward"]]
        assert lags and min(lags) >= 0, (log, lags)
        assert sampler == "ready_first" or max(lags) <= 1, (log, lags)


def newest_snapshot_anchor(checkpoints: Path) -> int:
    """The step of the newest trainer bundle that has rollout snapshots."""
    anchors = [step for step, bundle in complete_bundles(checkpoints) if snapshot_dirs(bundle)]
    assert anchors, "the run wrote no rollout snapshot under a trainer bundle"
    return anchors[-1]


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_every_sampler_resumes_from_its_bundle_and_from_a_rollout_snapshot(tmp_path: Path, sampler: str) -> None:
    checkpoints = tmp_path / "checkpoints"
    fit(tmp_path, sampler, steps=2)
    for _, bundle in complete_bundles(checkpoints):
        shutil.rmtree(bundle / SNAPSHOTS_DIR, ignore_errors=True)
    assert resumed_from(fit(tmp_path, sampler, steps=6)).endswith(f"{checkpoints / 'step_2'}")
    assert_history_exactly_once(tmp_path, steps=6)
    assert_lag_within_the_modes_bound(tmp_path, sampler)

    anchor = newest_snapshot_anchor(checkpoints)
    for step, bundle in complete_bundles(checkpoints):
        if step > anchor:
            shutil.rmtree(bundle)  # as if the run had died before renaming them
    assert SNAPSHOTS_DIR in resumed_from(fit(tmp_path, sampler, steps=7))
    assert_history_exactly_once(tmp_path, steps=7)
