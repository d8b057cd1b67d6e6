"""The kill test: SIGKILL a training run at random moments (once mid-bundle-write), restart the same command until
it finishes, and every prompt of the dataset has been trained exactly once, with no committed group dropped.

"Trained" means part of an optimizer step in the final run's history: ``train_data.jsonl`` rolls back with the
checkpoint a run resumes from, so steps lost to a crash and replayed count once. Real CLI, megatron-core policy,
Megatron engine, controller and data plane; only the timing of the kills is random (seeded).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from sc_lightning.checkpoint.atomic import complete_bundles, verify_bundle
from sc_lightning.checkpoint.snapshots import SNAPSHOTS_DIR
from tests.conftest import REPO, TEST_BASE, user_environment

pytestmark = pytest.mark.slow

PROMPTS = 160  # 40 steps of 4 groups x 4 generations


def write_dataset(path: Path) -> None:
    rng = random.Random(0)
    with path.open("w") as handle:
        for _ in range(PROMPTS):
            a, b = rng.randrange(10), rng.randrange(10)
            handle.write(json.dumps({"problem": f"{a}+{b}=", "expected_answer": str(a + b)}) + "\n")


def command(tmp_path: Path, layers: tuple[Path, ...] = TEST_BASE, *extra: str) -> list[str]:
    configs = [arg for path in layers for arg in ("--config", str(path))]
    return [
        sys.executable, "-m", "sc_lightning", "fit", *configs,
        "--data.dataset_name", str(tmp_path / "prompts.jsonl"),
        "--grpo.max_num_epochs", "1",
        "--grpo.max_num_steps", "1000",  # the dataset ends the run
        "--checkpointing.enabled", "true",
        "--checkpointing.checkpoint_dir", str(tmp_path / "checkpoints"),
        "--checkpointing.save_data_plane", "true",
        "--data.train_data_log", "true",
        "--data_plane.backend", "simple",  # TransferQueue on Ray: recovery through the production data plane
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false",
        *extra,
    ]  # fmt: skip


def wait_for(predicate, process: subprocess.Popen, what: str, timeout_s: float = 180) -> bool:
    """Poll an outside observation of the run until it holds (True) or the run ended first (False)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
    return True


def run_until_done(argv: list[str], moments: list[tuple], *, seed: int) -> tuple[int, list[str]]:
    """Run ``argv`` again and again, SIGKILLing run k when ``moments[k] = (observation, max_delay_s)`` holds plus a
    random delay of up to max_delay_s, until a run finishes; returns the number of kills and each run's stderr."""
    rng, env = random.Random(seed), user_environment()
    kills, stderrs = 0, []
    for _ in range(len(moments) + 8):
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if kills < len(moments) and wait_for(moments[kills][0](), process, f"kill moment {kills}"):
            time.sleep(rng.uniform(0, moments[kills][1]))  # chaos: the kill lands anywhere in the next step or two
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                stderrs.append(process.communicate(timeout=60)[1].decode())
                kills += 1
                continue
        stderrs.append(process.communicate(timeout=600)[1].decode())
        assert process.returncode == 0, stderrs[-1][-3000:]
        return kills, stderrs
    raise AssertionError("the run never finished")


def a_new_bundle(checkpoints: Path):  # noqa: ANN201
    """A kill moment for run_until_done: once armed, true when a bundle more than those complete now is written."""

    def arm():  # noqa: ANN202
        done = len(complete_bundles(checkpoints))
        return lambda: len(complete_bundles(checkpoints)) > done

    return arm


def assert_each_prompt_trained_once(tmp_path: Path, group_size: int = 4) -> None:
    """train_data.jsonl (the final run's history) trains every prompt exactly once, one whole group each."""
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    per_prompt = Counter(row["prompt_index"] for row in rows)
    assert sorted(per_prompt) == list(range(PROMPTS)), "every prompt of the dataset was trained"
    assert set(per_prompt.values()) == {group_size}, "exactly once: one group per prompt"
    per_group = Counter(row["group_id"] for row in rows)
    assert len(per_group) == PROMPTS and set(per_group.values()) == {group_size}
    assert sorted({row["step"] for row in rows}) == list(range(PROMPTS // 4))


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
