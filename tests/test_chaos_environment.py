"""Chaos: an environment that fails 20% of its scoring attempts; training goes on within its budgets and every
counter matches the injected failures exactly.

Real CLI, megatron-core policy, Megatron engine, controller and data plane; the faults are decided by a seeded
hash of (prompt, attempt), so the expected counts are computed here before the run and checked against the log
the environment writes and the metrics the run logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos_envs import attempt_fails
from tests.conftest import REPO, TEST_BASE
from tests.test_cli import RENDEZVOUS, step_metrics
from tests.test_recovery import write_dataset

pytestmark = pytest.mark.slow

PROMPTS, N, SEED, DATA_ATTEMPTS = 160, 4, 7, 2


def expected_faults() -> dict[str, int]:
    """Failed attempts per prompt id, as the seeded environment will inject them (at most DATA_ATTEMPTS)."""
    faults = {}
    for index in range(PROMPTS):
        pid, attempt = f"math-{index:06d}", 1
        while attempt <= DATA_ATTEMPTS and attempt_fails(SEED, pid, attempt):
            attempt += 1
        if attempt > 1:
            faults[pid] = attempt - 1
    return faults


def test_a_flaky_environment_trains_within_budget_and_the_counters_match_the_faults(tmp_path: Path) -> None:
    faults = expected_faults()
    dropped = sorted(pid for pid, n in faults.items() if n == DATA_ATTEMPTS)
    assert dropped and len(dropped) < len(faults), "the seed gives both retried-and-kept and dropped prompts"
    write_dataset(tmp_path / "prompts.jsonl")
    configs = [arg for path in TEST_BASE for arg in ("--config", str(path))]
    argv = [
        sys.executable, "-m", "sc_lightning", "fit", *configs,
        "--env.name", "tests.chaos_envs:FlakyArithmetic",
        "--data.dataset_name", str(tmp_path / "prompts.jsonl"),
        "--data.shuffle", "false",
        "--data.train_data_log", "true",
        "--grpo.max_num_epochs", "1",
        "--grpo.max_num_steps", "1000",  # the dataset ends the run
        "--async_rl.rollout_failure.max_data_attempts_per_prompt", str(DATA_ATTEMPTS),
        "--async_rl.rollout_failure.max_skipped_prompts", str(len(dropped)),
        "--async_rl.rollout_failure.min_step_batch_fraction", "0.5",
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    env |= {"SC_CHAOS_SEED": str(SEED), "SC_CHAOS_FAULT_LOG": str(tmp_path / "faults.log")}
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    logged = Counter(line.split()[0] for line in (tmp_path / "faults.log").read_text().splitlines())
    assert dict(logged) == faults  # the environment injected exactly the planned failures
    steps = step_metrics(tmp_path)
    last = steps[-1]
    total_faults = sum(faults.values())
    assert float(last["rollout/data_failures_total"]) == total_faults
    assert float(last["rollout/redispatch_total"]) == total_faults - len(dropped)  # every failure but the last
    assert float(last["rollout/dropped_total"]) == len(dropped)
    assert float(last["rollout/infra_failures_total"]) == 0
    assert sum(float(step["train/dropped_prompt_groups"]) for step in steps) == len(dropped)

    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    trained = Counter(row["prompt_id"] for row in rows)
    assert set(trained.values()) == {N}, "each trained prompt is one whole group"
    assert sorted(set(f"math-{i:06d}" for i in range(PROMPTS)) - set(trained)) == dropped
    groups_per_step = Counter(row["step"] for row in rows)
    for step in steps:  # each step shrank by exactly its dropped groups
        index = int(step["step"])
        assert groups_per_step[index] // N == N - float(step["train/dropped_prompt_groups"])
