"""Distributed checkpoints in real processes (gloo): saved on one layout, resumed on another, training goes on
exactly as an uninterrupted single-process run (policy weights and AdamW state resharded by dist_checkpointing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sc_lightning.trainer.sharded_checkpoint import load_sharded, save_sharded
from tests.ranks import run_ranks
from tests.trainer.test_data_parallel import (
    STEPS,
    assert_matches_one_process,
    full_weights,
    new_policy,
    train_steps,
)


def _first_step(rank: int, world_size: int, tensor_parallel_size: int, out: Path) -> None:
    """Train step 0 at this layout and save a distributed checkpoint of the policy and its AdamW."""
    model, optimizer = new_policy(tensor_parallel_size)
    metrics = train_steps(model, optimizer, range(1))
    save_sharded(out / "checkpoint", {"policy": (model, optimizer)})
    torch.save((metrics, live_children()), out / f"first{rank}.pt")


def live_children() -> list[str]:
    """The command lines of this process's children still running (a save must leave none, or they outlive a rank
    killed by a signal, holding its output pipes open)."""
    import psutil

    alive = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    return [" ".join(p.cmdline()) for p in alive]


def _later_steps(rank: int, world_size: int, tensor_parallel_size: int, out: Path) -> None:
    """Build the policy at this layout from another seed, load the checkpoint, train steps 1 and 2."""
    model, optimizer = new_policy(tensor_parallel_size, seed=99)  # every weight must come from the checkpoint
    load_sharded(out / "checkpoint", {"policy": (model, optimizer)})
    metrics = train_steps(model, optimizer, range(1, STEPS))
    torch.save((metrics, full_weights(model)), out / f"later{rank}.pt")


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("saved_at", "resumed_at"), [(1, 2), (2, 1)], ids=["dp2-to-tp2", "tp2-to-dp2"])
def test_a_checkpoint_saved_on_one_layout_resumes_on_another_as_if_uninterrupted(
    tmp_path: Path, saved_at: int, resumed_at: int
) -> None:
    """Two ranks: TP=1 is DP=2, TP=2 is DP=1."""
    run_ranks(_first_step, 2, saved_at, tmp_path)
    run_ranks(_later_steps, 2, resumed_at, tmp_path)
    model, optimizer = new_policy()
    single = (train_steps(model, optimizer, range(STEPS)), full_weights(model))
    for rank in range(2):
        first, children = torch.load(tmp_path / f"first{rank}.pt")
        assert children == [], f"rank {rank}'s save left processes running: {children}"
        later, weights = torch.load(tmp_path / f"later{rank}.pt")
        assert_matches_one_process(single, first + later, weights, rank)
