"""Data parallelism in real processes (gloo on the CPU): DP=2 and TP=2 x DP=2 policy updates equal one process's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.controller.api import GroupMeta
from sc_lightning.trainer.data_parallel import share_of_groups
from tests.helpers.parallel import (
    assert_matches_one_process,
    assert_ppo_matches_one_process,
    train_ppo_three_steps,
    train_three_steps,
)
from tests.ranks import run_ranks


def _data_parallel_rank(
    rank: int, world_size: int, tensor_parallel_size: int, distributed_optimizer: bool, out: Path
) -> None:
    """A rank of a DP (x TP) run: train and save what it saw."""
    result = train_three_steps(tensor_parallel_size, distributed_optimizer=distributed_optimizer)
    torch.save(result, out / f"rank{rank}.pt")


@pytest.mark.slow  # ranks in processes, minutes on 2 cores
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("world_size", "tensor_parallel_size", "distributed_optimizer"),
    [(2, 1, False), (4, 2, False), (2, 1, True)],
    ids=["dp2", "tp2xdp2", "dp2-distributed-optimizer"],
)
def test_a_data_parallel_policy_update_equals_the_single_process_one(
    tmp_path: Path, world_size: int, tensor_parallel_size: int, distributed_optimizer: bool
) -> None:
    """With megatron's distributed optimizer each rank keeps about half of the AdamW state, and the update is the
    same."""
    run_ranks(_data_parallel_rank, world_size, tensor_parallel_size, distributed_optimizer, tmp_path)
    single_metrics, single_weights, single_ddp, single_kept = train_three_steps()
    assert not single_ddp and single_kept == 1.0
    assert all(m["grad_norm"] > 0.05 for m in single_metrics), "the clip must bite for the test to check the norm"
    kept_in_all = 0.0
    for rank in range(world_size):
        metrics, weights, used_ddp, kept = torch.load(tmp_path / f"rank{rank}.pt")
        assert used_ddp, "several data-parallel ranks must sum their gradients through megatron's DDP"
        assert_matches_one_process((single_metrics, single_weights), metrics, weights, rank)
        assert (kept < 0.6) if distributed_optimizer else (kept == 1.0), kept
        kept_in_all += kept
    if distributed_optimizer:  # the replicas' slices cover every parameter once
        assert kept_in_all == pytest.approx(1.0)


def _ppo_rank(rank: int, world_size: int, distributed_optimizer: bool, out: Path) -> None:
    """A rank of a DP=2 PPO run."""
    torch.save(train_ppo_three_steps(distributed_optimizer=distributed_optimizer), out / f"ppo{rank}.pt")


@pytest.mark.slow  # ranks in processes, minutes on 2 cores
@pytest.mark.timeout(900)
@pytest.mark.parametrize("distributed_optimizer", [False, True], ids=["adamw", "distributed-optimizer"])
def test_a_data_parallel_ppo_step_equals_the_single_process_one(tmp_path: Path, distributed_optimizer: bool) -> None:
    run_ranks(_ppo_rank, 2, distributed_optimizer, tmp_path)
    assert_ppo_matches_one_process(tmp_path, 2)


@given(
    lengths=st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=4), min_size=0, max_size=12),
    size=st.integers(1, 4),
)
def test_every_group_goes_to_exactly_one_rank_and_the_loads_stay_within_one_group(
    lengths: list[list[int]], size: int
) -> None:
    groups = [GroupMeta(f"g{i}", f"p{i}", tuple(map(str, ls)), tuple(ls), 0, 0, None) for i, ls in enumerate(lengths)]
    shares = [share_of_groups(groups, rank, size) for rank in range(size)]
    assert sorted(g.group_id for share in shares for g in share) == sorted(g.group_id for g in groups)
    for share in shares:  # each share keeps the groups' order
        assert [groups.index(g) for g in share] == sorted(groups.index(g) for g in share)
    loads = [sum(sum(g.sequence_lengths) for g in share) for share in shares]
    biggest = max((sum(g.sequence_lengths) for g in groups), default=0)
    assert max(loads, default=0) - min(loads, default=0) <= biggest
