"""Reward scaling and DAPO's overlong shaping (sc_lightning/rollout/reward_shaping.py), by hand-computed values,
through GRPO's advantages, from the config, and in a real run: the rows trained hold the transformed rewards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_lightning.algorithms import grpo_advantages_by_group
from sc_lightning.cli.load import LIGHTNING_KEYS
from sc_lightning.config import SCConfig, load_config
from sc_lightning.rollout.reward_shaping import OverlongPenalty, RewardScale, RewardTransform, reward_transform
from sc_lightning.types import Generation, Prompt, ScoredGroup
from tests.helpers.cli import run
from tests.helpers.configs import TEST_BASE, variant
from tests.helpers.recovery import command, write_dataset


def config_of(raw: dict[str, Any]) -> SCConfig:
    return load_config(raw, extra_top_level=LIGHTNING_KEYS)


def completion(length: int) -> Generation:
    return Generation(tuple(range(length)), (0.0,) * length, "stop", 0)


def test_scaling_clamps_to_the_source_range_and_maps_it_onto_the_target() -> None:
    scale = RewardScale(source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0)
    assert [scale(r) for r in (0.0, 0.25, 1.0, 2.0, -3.0)] == [-1.0, -0.5, 1.0, 1.0, -1.0]


def test_the_overlong_penalty_ramps_over_the_buffer_before_the_limit() -> None:
    penalty = OverlongPenalty(max_response_length=10, buffer_length=4, penalty=1.0)
    assert [penalty(length) for length in (3, 6, 7, 8, 10)] == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert OverlongPenalty(10, 0, 0.5)(10) == 0.0 and OverlongPenalty(10, 0, 0.5)(11) == -0.5


def test_a_group_is_scaled_then_shaped_and_grpo_advantages_follow_the_shaped_rewards() -> None:
    transform = RewardTransform(RewardScale(0.0, 1.0, 0.0, 2.0), OverlongPenalty(10, 4, 1.0))
    group = ScoredGroup(Prompt("p", (1,)), (completion(6), completion(8), completion(10)), (1.0, 1.0, 0.5))
    shaped = transform(group)
    assert shaped.rewards == (2.0, 1.5, 0.0)  # 2 - 0; 2 - 0.5; 1 - 1
    assert shaped.generations == group.generations and shaped.prompt == group.prompt
    advantages = grpo_advantages_by_group(torch.tensor(shaped.rewards), ["g"] * 3, leave_one_out=True, normalize=False)
    assert advantages.tolist() == [1.25, 0.5, -1.75]  # each reward minus the mean of the other two


def test_the_transform_comes_from_the_config_with_the_generation_limit_by_default() -> None:
    assert reward_transform(config_of(variant())) is None
    shaping = {"enabled": True, "overlong_buffer_length": 2, "overlong_buffer_penalty": 0.5}
    scaling = {"enabled": True, "source_min": 0.0, "source_max": 1.0, "target_min": -1.0, "target_max": 1.0}
    transform = reward_transform(config_of(variant({"grpo": {"reward_shaping": shaping, "reward_scaling": scaling}})))
    assert transform == RewardTransform(RewardScale(0.0, 1.0, -1.0, 1.0), OverlongPenalty(4, 2, 0.5))  # 4 new tokens


@pytest.mark.slow
def test_a_run_trains_the_scaled_rewards(tmp_path: Path) -> None:
    """The arithmetic verifier's 0/1 rewards, scaled onto [-1, 1], are what the rows hold and the trainer logs."""
    write_dataset(tmp_path / "prompts.jsonl")
    argv = command(
        tmp_path, TEST_BASE,
        "--grpo.max_num_steps", "3",
        "--checkpointing.enabled", "false",
        "--checkpointing.save_data_plane", "false",
        "--data_plane.backend", "memory",
        "--grpo.reward_scaling", json.dumps({"enabled": True, "target_min": -1.0, "target_max": 1.0}),
    )  # fmt: skip
    done = run(*argv[3:], timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rewards = [json.loads(line)["reward"] for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    assert len(rewards) == 3 * 16 and set(rewards) <= {-1.0, 1.0} and -1.0 in rewards
