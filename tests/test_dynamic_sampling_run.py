"""Dynamic sampling end to end: the tiny example with ``grpo.use_dynamic_sampling``, SIGKILLed once and resumed.

Real CLI, megatron-core policy, Megatron engine, controller and data plane. ``train_data.jsonl`` (the final run's
history, rolled back with the checkpoint a run resumes from) must show: no trained group with zero reward variance,
every filtered group recorded with its reason, each step's refills within the cap, and every prompt consumed once —
trained or filtered, never both, never twice — across the kill.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.helpers.configs import TEST_BASE
from tests.helpers.recovery import a_new_bundle, command, run_until_done, write_dataset

pytestmark = pytest.mark.slow

STEPS, GROUPS, MAX_GEN_BATCHES = 4, 4, 3  # small_steps.yaml: 4 groups x 4 generations per step


def test_dynamic_sampling_trains_no_zero_variance_group_and_a_kill_keeps_exactly_once(tmp_path: Path) -> None:
    write_dataset(tmp_path / "prompts.jsonl")
    checkpoints = tmp_path / "checkpoints"
    argv = command(
        tmp_path, TEST_BASE,
        "--data_plane.backend", "memory",
        "--checkpointing.save_period", "1",
        "--grpo.max_num_steps", str(STEPS),
        "--grpo.use_dynamic_sampling", "true",
        "--grpo.dynamic_sampling_max_gen_batches", str(MAX_GEN_BATCHES),
    )  # fmt: skip

    progressed = a_new_bundle(checkpoints)
    kills, _ = run_until_done(argv, [(progressed, 0.2)], seed=5)
    assert kills == 1, "the kill did not land"

    lines = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    trained = [line for line in lines if "filtered" not in line]
    filtered = [line for line in lines if "filtered" in line]
    rewards: dict[tuple[int, str], list[float]] = defaultdict(list)
    prompt_of: dict[tuple[int, str], int] = {}
    for row in trained:
        rewards[row["step"], row["group_id"]].append(row["reward"])
        prompt_of[row["step"], row["group_id"]] = row["prompt_index"]
    assert sorted({step for step, _ in rewards}) == list(range(STEPS))
    assert Counter(step for step, _ in rewards) == {step: GROUPS for step in range(STEPS)}, "a step shrank"
    zero_variance = [key for key, values in rewards.items() if max(values) == min(values)]
    assert zero_variance == [], f"trained groups with zero reward variance: {zero_variance}"

    assert filtered, "the tiny model's groups are often all right or all wrong: some must have been filtered"
    assert all(line["filtered"] == "zero_reward_variance" for line in filtered)
    assert all(max(line["rewards"]) == min(line["rewards"]) for line in filtered)
    per_step = Counter(line["step"] for line in filtered)
    assert max(per_step.values()) <= (MAX_GEN_BATCHES - 1) * GROUPS, f"refills past the cap: {per_step}"

    consumed = Counter([*prompt_of.values(), *(line["prompt_index"] for line in filtered)])
    assert [index for index, n in consumed.items() if n > 1] == [], "a prompt was consumed twice"
