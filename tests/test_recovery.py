"""The kill test: SIGKILL a training run at random moments (once mid-bundle-write), restart the same command until
it finishes, and every prompt of the dataset has been trained exactly once, with no committed group dropped.

"Trained" means part of an optimizer step in the final run's history: ``train_data.jsonl`` rolls back with the
checkpoint a run resumes from, so steps lost to a crash and replayed count once. Real CLI, megatron-core policy,
Megatron engine, controller and data plane; only the timing of the kills is random (seeded).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sc_lightning.checkpoint.atomic import complete_bundles, verify_bundle
from sc_lightning.checkpoint.snapshots import SNAPSHOTS_DIR
from tests.helpers.configs import REPO, TEST_BASE
from tests.helpers.recovery import a_new_bundle, assert_each_prompt_trained_once, command, run_until_done, write_dataset

pytestmark = pytest.mark.slow


@pytest.mark.long(minutes=1)
def test_sigkill_at_random_moments_trains_every_prompt_exactly_once(tmp_path: Path) -> None:
    """Colocated, in-process data plane, a bundle after every step; the first kill lands mid-bundle-write."""
    write_dataset(tmp_path / "prompts.jsonl")
    checkpoints = tmp_path / "checkpoints"
    argv = command(tmp_path, TEST_BASE, "--data_plane.backend", "memory", "--checkpointing.save_period", "1")

    def writing():
        return lambda: any(p.name.startswith("tmp_") for p in checkpoints.glob("*"))

    progressed = a_new_bundle(checkpoints)
    kills, _ = run_until_done(argv, [(writing, 0.0)] + [(progressed, 0.2)] * 3, seed=1234)
    assert kills >= 3, f"only {kills} kills landed"
    assert_each_prompt_trained_once(tmp_path)
    for _, bundle in complete_bundles(checkpoints):  # every bundle left behind is whole
        verify_bundle(bundle)


@pytest.mark.long(minutes=3.5)
def test_sigkill_with_rollout_snapshots_resumes_between_trainer_checkpoints(tmp_path: Path) -> None:
    """Async (one version ahead, engine in a Ray actor), TransferQueue, a bundle every 3 steps and a rollout
    snapshot attempt every 0.2 s with token capture: kills land after new snapshots, restarts resume from them."""
    write_dataset(tmp_path / "prompts.jsonl")
    checkpoints = tmp_path / "checkpoints"
    argv = command(
        tmp_path,
        (REPO / "configs" / "grpo_tiny.yaml", REPO / "tests" / "small_steps.yaml"),
        "--async_rl.max_buffered_rollouts", "8",
        "--async_rl.max_inflight_prompts", "8",
        "--checkpointing.save_period", "3",
        "--rollout_checkpointing.snapshot_attempt_interval_s", "0.2",
        "--token_capture.enabled", "true",
    )  # fmt: skip

    def snapshots() -> set[Path]:
        return set(checkpoints.glob(f"*/{SNAPSHOTS_DIR}/snapshot_*"))

    def new_snapshot():  # by name: retention removes older ones, so their number can fall
        seen = snapshots()
        return lambda: bool(snapshots() - seen)

    kills, stderrs = run_until_done(argv, [(new_snapshot, 0.3)] * 4, seed=99)
    assert kills >= 3, f"only {kills} kills landed"
    resumed = [line for err in stderrs for line in err.splitlines() if line.startswith("resuming from")]
    assert any(SNAPSHOTS_DIR in line for line in resumed), resumed  # at least one restart used a rollout snapshot
    assert_each_prompt_trained_once(tmp_path)


@pytest.mark.long(minutes=1.5)
def test_sigkill_during_distillation_resumes_with_the_teachers_logprobs(tmp_path: Path) -> None:
    """On-policy distillation, async (one version ahead), a bundle every step: after the kills every prompt is trained
    exactly once, each row by its teacher. A restored row is trained from its saved teacher logprobs: the trainer
    reads them with the row, and a row without them fails the step (MissingRowsError), so the run could not finish."""
    write_dataset(tmp_path / "prompts.jsonl")
    checkpoints = tmp_path / "checkpoints"
    layers = (
        REPO / "configs" / "grpo_tiny.yaml",
        REPO / "tests" / "small_steps.yaml",
        REPO / "tests" / "distill_steps.yaml",
    )
    argv = command(
        tmp_path,
        layers,
        "--data_plane.backend", "memory",
        "--async_rl.max_buffered_rollouts", "8",
        "--async_rl.max_inflight_prompts", "8",
        "--checkpointing.save_period", "1",
    )  # fmt: skip
    kills, stderrs = run_until_done(argv, [(a_new_bundle(checkpoints), 0.2)] * 3, seed=40)
    assert kills >= 2, f"only {kills} kills landed"
    assert any(line.startswith("resuming from") for err in stderrs for line in err.splitlines())
    assert_each_prompt_trained_once(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    assert {row["teacher"] for row in rows} == {"add"}
