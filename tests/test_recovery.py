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
from tests.conftest import REPO, TEST_BASE

pytestmark = pytest.mark.slow

PROMPTS = 160  # 40 steps of 4 groups x 4 generations
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def write_dataset(path: Path) -> None:
    rng = random.Random(0)
    with path.open("w") as handle:
        for _ in range(PROMPTS):
            a, b = rng.randrange(10), rng.randrange(10)
            handle.write(json.dumps({"problem": f"{a}+{b}=", "expected_answer": str(a + b)}) + "\n")


def command(tmp_path: Path) -> list[str]:
    layers = [arg for path in TEST_BASE for arg in ("--config", str(path))]
    return [
        sys.executable, "-m", "sc_lightning", "fit", *layers,
        "--data.dataset_name", str(tmp_path / "prompts.jsonl"),
        "--grpo.max_num_epochs", "1",
        "--grpo.max_num_steps", "1000",  # the dataset ends the run
        "--data_plane.backend", "memory",
        "--checkpointing.enabled", "true",
        "--checkpointing.checkpoint_dir", str(tmp_path / "checkpoints"),
        "--checkpointing.save_period", "1",
        "--checkpointing.save_data_plane", "true",
        "--data.train_data_log", "true",
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false",
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


def test_sigkill_at_random_moments_trains_every_prompt_exactly_once(tmp_path: Path) -> None:
    write_dataset(tmp_path / "prompts.jsonl")
    checkpoints, rng = tmp_path / "checkpoints", random.Random(1234)
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    kills, runs = 0, 0
    while True:
        runs += 1
        assert runs <= 12, "the run never finished"
        process = subprocess.Popen(
            command(tmp_path), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        done = len(complete_bundles(checkpoints))
        if kills == 0:  # the first kill lands while a bundle is being written
            writing = lambda: any(p.name.startswith("tmp_") for p in checkpoints.glob("*"))  # noqa: E731
            caught = wait_for(writing, process, "a bundle write")
        elif kills < 4:  # then at a random moment after the run made progress
            progressed = lambda done=done: len(complete_bundles(checkpoints)) > done  # noqa: E731
            caught = wait_for(progressed, process, "a new bundle")
            time.sleep(rng.uniform(0, 0.2))  # chaos: the kill lands anywhere in the next step or two
        else:
            caught = False
        if caught and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
            kills += 1
            continue
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr.decode()[-3000:]
        break
    assert kills >= 3, f"only {kills} kills landed"

    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    per_prompt = Counter(row["prompt_index"] for row in rows)
    assert sorted(per_prompt) == list(range(PROMPTS)), "every prompt of the dataset was trained"
    assert set(per_prompt.values()) == {4}, "exactly once: one group of 4 generations per prompt"
    per_group = Counter(row["group_id"] for row in rows)
    assert len(per_group) == PROMPTS and set(per_group.values()) == {4}
    assert sorted({row["step"] for row in rows}) == list(range(PROMPTS // 4))
    for _, bundle in complete_bundles(checkpoints):  # every bundle left behind is whole
        verify_bundle(bundle)
