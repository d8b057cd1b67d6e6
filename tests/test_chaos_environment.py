"""Chaos: an environment that fails 20% of its scoring attempts; training goes on within its budgets and every
counter matches the injected failures exactly.

Real CLI, megatron-core policy, Megatron engine, controller and data plane; the faults are decided by a seeded
hash of (prompt, attempt), so the expected counts are computed here before the run and checked against the log
the environment writes and the metrics the run logs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos_envs import attempt_fails
from tests.helpers.cli import run, step_metrics, user_environment
from tests.helpers.configs import TEST_BASE
from tests.helpers.recovery import write_dataset

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


def train_with_flaky_environment(tmp_path: Path, *extra: str) -> tuple[list[dict[str, str]], list[dict], Counter]:
    """Run the CLI over the 160-prompt file with the flaky environment; (metrics rows, train_data rows, faults
    logged per prompt id)."""
    write_dataset(tmp_path / "prompts.jsonl")
    configs = [arg for path in TEST_BASE for arg in ("--config", str(path))]
    env = user_environment()
    env |= {"SC_CHAOS_SEED": str(SEED), "SC_CHAOS_FAULT_LOG": str(tmp_path / "faults.log")}
    result = run(
        "fit", *configs,
        "--env.name", "tests.chaos_envs:FlakyArithmetic",
        "--data.dataset_name", str(tmp_path / "prompts.jsonl"),
        "--data.shuffle", "false",
        "--data.train_data_log", "true",
        "--grpo.max_num_epochs", "1",
        "--grpo.max_num_steps", "1000",  # the dataset ends the run
        "--async_rl.rollout_failure.max_data_attempts_per_prompt", str(DATA_ATTEMPTS),
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false",
        *extra,
        timeout_s=600,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    logged = Counter(line.split()[0] for line in (tmp_path / "faults.log").read_text().splitlines())
    return step_metrics(tmp_path), rows, logged


def assert_counters_match(last: dict[str, str], logged: Counter, dropped: list[str]) -> None:
    """The run's totals against the faults the environment logged."""
    assert float(last["rollout/data_failures_total"]) == sum(logged.values())
    assert float(last["rollout/redispatch_total"]) == sum(logged.values()) - len(dropped)  # all but each last
    assert float(last["rollout/dropped_total"]) == len(dropped)
    assert float(last["rollout/infra_failures_total"]) == 0


def test_a_flaky_environment_shrinks_steps_within_budget_and_the_counters_match_the_faults(tmp_path: Path) -> None:
    faults = expected_faults()
    dropped = sorted(pid for pid, n in faults.items() if n == DATA_ATTEMPTS)
    assert dropped and len(dropped) < len(faults), "the seed gives both retried-and-kept and dropped prompts"
    steps, rows, logged = train_with_flaky_environment(
        tmp_path,
        "--async_rl.rollout_failure.max_skipped_prompts", str(len(dropped)),
        "--async_rl.rollout_failure.min_step_batch_fraction", "0.5",
    )  # fmt: skip
    assert dict(logged) == faults  # the environment injected exactly the planned failures
    assert_counters_match(steps[-1], logged, dropped)
    assert sum(float(step["train/dropped_prompt_groups"]) for step in steps) == len(dropped)
    trained = Counter(row["prompt_id"] for row in rows)
    assert set(trained.values()) == {N}, "each trained prompt is one whole group"
    assert sorted(set(f"math-{i:06d}" for i in range(PROMPTS)) - set(trained)) == dropped
    groups_per_step = Counter(row["step"] for row in rows)
    for step in steps:  # each step shrank by exactly its dropped groups
        index = int(step["step"])
        assert groups_per_step[index] // N == N - float(step["train/dropped_prompt_groups"])


def test_a_flaky_environment_with_replacement_keeps_every_step_whole(tmp_path: Path) -> None:
    """on_dropped_prompt: replace — spares from the reserve take the dropped groups' places: no step shrinks."""
    steps, rows, logged = train_with_flaky_environment(
        tmp_path,
        "--async_rl.rollout_failure.max_skipped_prompts", "40",
        "--async_rl.rollout_failure.on_dropped_prompt", "replace",
        "--async_rl.rollout_failure.replacement_reserve_prompts", str(N),
        "--async_rl.rollout_failure.max_replacement_attempts", "2",
    )  # fmt: skip
    dropped = sorted(pid for pid, n in logged.items() if n == DATA_ATTEMPTS)
    assert dropped, "the seed drops some prompts"
    assert all(n <= DATA_ATTEMPTS for n in logged.values())
    assert_counters_match(steps[-1], logged, dropped)
    # a replaced slot counts once even when its first spare was dropped too and a second one took its place
    replaced = float(steps[-1]["rollout/replaced_total"])
    assert 1 <= replaced <= len(dropped)
    assert sum(float(step["train/replaced_prompt_groups"]) for step in steps) == replaced
    assert sum(float(step["train/dropped_prompt_groups"]) for step in steps) == 0, "no step shrank"
    groups_per_step = Counter(row["step"] for row in rows)
    assert set(groups_per_step.values()) == {N * N}, "every step trained N whole groups"
    trained = {row["prompt_id"] for row in rows}
    assert not trained & set(dropped)
    untrained = {f"math-{i:06d}" for i in range(PROMPTS)} - trained - set(dropped)
    assert len(untrained) < N, f"only spares fewer than a step are left untrained: {sorted(untrained)}"
