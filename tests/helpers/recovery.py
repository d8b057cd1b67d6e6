"""Runs killed and resumed: the arithmetic dataset they train, the checkpointed command, the kill loop, and the
exactly-once check of what the final run trained."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sc_lightning.checkpoint.atomic import complete_bundles
from tests.helpers.cli import start, wait_for
from tests.helpers.configs import TEST_BASE

PROMPTS = 160  # 40 steps of 4 groups x 4 generations


def write_dataset(path: Path) -> None:
    """PROMPTS seeded ``a+b=`` prompts as a JSONL dataset."""
    rng = random.Random(0)
    with path.open("w") as handle:
        for _ in range(PROMPTS):
            a, b = rng.randrange(10), rng.randrange(10)
            handle.write(json.dumps({"problem": f"{a}+{b}=", "expected_answer": str(a + b)}) + "\n")


def command(tmp_path: Path, layers: tuple[Path, ...] = TEST_BASE, *extra: str) -> list[str]:
    """``fit`` over ``layers`` of the dataset in ``tmp_path`` to its end, a bundle per save period, the train-data
    log on, TransferQueue as the data plane (``extra`` may override any of it)."""
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


def run_until_done(argv: list[str], moments: list[tuple], *, seed: int) -> tuple[int, list[str]]:
    """Run ``argv`` again and again, SIGKILLing run k when ``moments[k] = (observation, max_delay_s)`` holds plus a
    random delay of up to max_delay_s, until a run finishes; returns the number of kills and each run's stderr."""
    rng = random.Random(seed)
    kills, stderrs = 0, []
    for _ in range(len(moments) + 8):
        process = start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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


def a_new_bundle(checkpoints: Path) -> Callable[[], Callable[[], bool]]:
    """A kill moment for run_until_done: once armed, true when a bundle more than those complete now is written."""

    def arm() -> Callable[[], bool]:
        done = len(complete_bundles(checkpoints))
        return lambda: len(complete_bundles(checkpoints)) > done

    return arm


def assert_trained_once(tmp_path: Path, steps: int, group_size: int = 4) -> set[int]:
    """train_data.jsonl (the final run's history) holds steps 0 .. ``steps`` - 1 and trains each of its prompts
    exactly once, one whole group each; returns the prompts trained."""
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    per_prompt = Counter(row["prompt_index"] for row in rows)
    assert set(per_prompt.values()) == {group_size}, "exactly once: one group per prompt"
    per_group = Counter(row["group_id"] for row in rows)
    assert len(per_group) == len(per_prompt) and set(per_group.values()) == {group_size}
    assert sorted({row["step"] for row in rows}) == list(range(steps))
    return set(per_prompt)


def assert_each_prompt_trained_once(tmp_path: Path, group_size: int = 4) -> None:
    """train_data.jsonl (the final run's history) trains every prompt exactly once, one whole group each."""
    trained = assert_trained_once(tmp_path, PROMPTS // 4, group_size)
    assert sorted(trained) == list(range(PROMPTS)), "every prompt of the dataset was trained"


def assert_history_exactly_once(tmp_path: Path, steps: int, groups: int = 4, generations: int = 4) -> None:
    """train_data.jsonl (the final run's history): steps 0 .. ``steps`` - 1 each trained ``groups`` whole groups, and
    no prompt was trained twice."""
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    assert Counter(row["step"] for row in rows) == {step: groups * generations for step in range(steps)}
    per_group = Counter(row["group_id"] for row in rows)
    assert set(per_group.values()) == {generations}, "whole groups"
    prompts_of_group = {(row["group_id"], row["prompt_index"]) for row in rows}
    per_prompt = Counter(prompt for _, prompt in prompts_of_group)
    assert len(prompts_of_group) == len(per_group) and set(per_prompt.values()) == {1}, "no prompt twice"


def one_ahead_with_a_bundle_per_step(tmp_path: Path, steps: int, groups: int = 4) -> list[str]:
    """``fit`` arguments for ``steps`` steps of the colocated engine one version ahead, a buffer of two steps and the
    in-process data plane (quick runs whose bundles hold buffered rows), a bundle every step with its rows, and the
    train-data log in ``tmp_path``."""
    return [
        "--policy.generation.colocated.enabled", "true",
        "--async_rl.max_buffered_rollouts", str(2 * groups),
        "--async_rl.max_inflight_prompts", str(2 * groups),
        "--data_plane.backend", "memory",
        "--grpo.max_num_steps", str(steps),
        "--checkpointing.enabled", "true",
        "--checkpointing.checkpoint_dir", str(tmp_path / "checkpoints"),
        "--checkpointing.save_data_plane", "true",
        "--checkpointing.save_period", "1",
        "--data.train_data_log", "true",
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
