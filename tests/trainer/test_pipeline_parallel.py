"""Pipeline parallelism in real processes (gloo on the CPU): PP=2 (and PP=2 x DP=2) GRPO updates, and PP=2 PPO
steps (critic, frozen pi_old, a reference policy's KL term), through megatron-core's pipeline schedule equal one
process's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.parallel import (
    KEYS,
    STEPS,
    assert_ppo_matches_one_process,
    new_policy,
    stage_weights,
    train_ppo_three_steps,
    train_steps,
)
from tests.ranks import run_ranks


def _pipeline_rank(rank: int, world_size: int, out: Path) -> None:
    """A rank of a PP=2 run: three GRPO steps on its stage; its metrics and its stage's weights."""
    model, optimizer = new_policy(pipeline_parallel_size=2)
    metrics = train_steps(model, optimizer, range(STEPS))
    torch.save((metrics, stage_weights(model)), out / f"rank{rank}.pt")


@pytest.mark.slow  # ranks in processes, minutes on 2 cores
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world_size", [2, 4], ids=["pp2", "pp2xdp2"])
def test_a_pipeline_parallel_policy_update_equals_the_single_process_one(tmp_path: Path, world_size: int) -> None:
    run_ranks(_pipeline_rank, world_size, tmp_path)
    model, optimizer = new_policy()
    single_metrics = train_steps(model, optimizer, range(STEPS))
    single_weights = stage_weights(model)
    covered: dict[str, torch.Tensor] = {}
    for rank in range(world_size):
        metrics, weights = torch.load(tmp_path / f"rank{rank}.pt")
        for one, split in zip(single_metrics, metrics, strict=True):
            for key in KEYS:
                assert split[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), (rank, key)
        covered.update(weights)
        for name, tensor in weights.items():
            torch.testing.assert_close(tensor, single_weights[name], rtol=1e-5, atol=2e-6, msg=f"rank {rank}: {name}")
    assert covered.keys() == single_weights.keys()  # the stages together hold the whole model


def _ppo_pipeline_rank(rank: int, world_size: int, out: Path) -> None:
    """A rank of a PP=2 PPO run: its stage of the policy and of the critic."""
    torch.save(train_ppo_three_steps(pipeline_parallel_size=2), out / f"ppo{rank}.pt")


@pytest.mark.slow  # ranks in processes, minutes on 2 cores
@pytest.mark.timeout(900)
def test_a_pipeline_parallel_ppo_step_equals_the_single_process_one(tmp_path: Path) -> None:
    run_ranks(_ppo_pipeline_rank, 2, tmp_path)
    assert_ppo_matches_one_process(tmp_path, 2)
