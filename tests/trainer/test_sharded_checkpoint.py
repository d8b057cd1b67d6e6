"""Distributed checkpoints in real processes (gloo): saved on one layout, resumed on another, training goes on
exactly as an uninterrupted single-process run (policy weights and AdamW state resharded by dist_checkpointing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sc_lightning.trainer.sharded_checkpoint import load_sharded, save_sharded
from tests.helpers.parallel import STEPS, assert_matches_one_process, full_weights, new_policy, train_steps
from tests.ranks import run_ranks


def _first_step(rank: int, world_size: int, tensor_parallel_size: int, distributed: bool, out: Path) -> None:
    """Train step 0 at this layout and save a distributed checkpoint of the policy and its AdamW (megatron's
    distributed optimizer with ``distributed``)."""
    model, optimizer = new_policy(tensor_parallel_size, distributed_optimizer=distributed)
    metrics = train_steps(model, optimizer, range(1))
    save_sharded(out / "checkpoint", {"policy": (model, optimizer)})
    torch.save((metrics, live_children()), out / f"first{rank}.pt")


def live_children() -> list[str]:
    """The command lines of this process's children still running (a save must leave none, or they outlive a rank
    killed by a signal, holding its output pipes open)."""
    import psutil

    alive = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    return [" ".join(p.cmdline()) for p in alive]


def _later_steps(rank: int, world_size: int, tensor_parallel_size: int, distributed: bool, out: Path) -> None:
    """Build the policy at this layout from another seed, load the checkpoint, train steps 1 and 2."""
    # every weight must come from the checkpoint
    model, optimizer = new_policy(tensor_parallel_size, seed=99, distributed_optimizer=distributed)
    load_sharded(out / "checkpoint", {"policy": (model, optimizer)})
    metrics = train_steps(model, optimizer, range(1, STEPS))
    torch.save((metrics, full_weights(model)), out / f"later{rank}.pt")


@pytest.mark.slow  # ranks in processes, minutes on 2 cores
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("saved_at", "resumed_at", "distributed"),
    [(1, 2, False), (2, 1, False), (1, 2, True), (2, 1, True)],
    ids=["dp2-to-tp2", "tp2-to-dp2", "dp2-to-tp2-distributed-optimizer", "tp2-to-dp2-distributed-optimizer"],
)
def test_a_checkpoint_saved_on_one_layout_resumes_on_another_as_if_uninterrupted(
    tmp_path: Path, saved_at: int, resumed_at: int, distributed: bool
) -> None:
    """Two ranks: TP=1 is DP=2, TP=2 is DP=1. megatron's distributed optimizer saves the slices of its state that
    each data-parallel rank keeps as whole tensors, so they reshard too."""
    run_ranks(_first_step, 2, saved_at, distributed, tmp_path)
    run_ranks(_later_steps, 2, resumed_at, distributed, tmp_path)
    model, optimizer = new_policy()
    single = (train_steps(model, optimizer, range(STEPS)), full_weights(model))
    for rank in range(2):
        first, children = torch.load(tmp_path / f"first{rank}.pt")
        assert children == [], f"rank {rank}'s save left processes running: {children}"
        later, weights = torch.load(tmp_path / f"later{rank}.pt")
        assert_matches_one_process(single, first + later, weights, rank)


def test_a_resume_with_another_optimizer_form_fails_naming_the_knob(tmp_path: Path) -> None:
    """One process: AdamW's moments saved, megatron's distributed optimizer asking for its main weights too."""
    model, optimizer = new_policy()
    train_steps(model, optimizer, range(1))
    save_sharded(tmp_path / "checkpoint", {"policy": (model, optimizer)})
    model, optimizer = new_policy(distributed_optimizer=True)
    expected = r"saved by a non-distributed optimizer, but this run uses megatron's distributed .* set to false"
    with pytest.raises(ValueError, match=expected):
        load_sharded(tmp_path / "checkpoint", {"policy": (model, optimizer)})
