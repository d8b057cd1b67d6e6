"""Many trainer ranks over one controller, in real processes (gloo): who reads which rows, and how failures spread.

Every rank runs the RL step stream; the leader's selections come from a scripted controller (a stand-in: the real
controller is exercised by the CLI tests in tests/lightning/test_multi_rank.py) and reach the other ranks through
rank_sync's broadcast. Each rank holds the same rows in its own in-process data plane (a stand-in for TransferQueue,
which every rank reaches in a real run) wrapped to count the keys it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from sc_lightning.controller.api import GroupMeta, SelectTimeout
from sc_lightning.controller.rows import group_to_columns
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.models.megatron import init_model_parallel
from sc_lightning.trainer.rank_sync import FollowerSelect, LeaderFailed, LeaderSelect, RankGroup
from sc_lightning.trainer.step_stream import RLStepStream, StepSettings
from tests.controller.helpers import scored
from tests.ranks import run_ranks

STEPS, GROUPS_PER_STEP, CHUNK = 3, 4, 2  # each step streamed as two chunks of two groups


class CountingPlane(MemoryDataPlane):
    """An in-process data plane that records every key read through ``get``."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []

    def get(self, keys: Sequence[str], fields: Sequence[str]) -> dict[str, list[torch.Tensor]]:
        """Read as usual, recording the keys."""
        self.read += list(keys)
        return super().get(keys, fields)


def all_groups() -> list[GroupMeta]:
    """Every group of the run, with lengths that differ so the data-parallel split has something to balance."""
    groups = []
    for index in range(STEPS * GROUPS_PER_STEP):
        rewards = (1.0, 0.0) if index % 3 else (1.0, 0.0, 1.0, 0.0)
        keys = tuple(f"g{index}/g{i}" for i in range(len(rewards)))
        groups.append(GroupMeta(f"g{index}", f"p{index}", keys, (5,) * len(keys), 0, 0, None))
    return groups


def fill(plane: MemoryDataPlane) -> None:
    """Commit every group's rows (identical on every rank)."""
    for index, group in enumerate(all_groups()):
        keys, columns, tags = group_to_columns(
            group.group_id,
            scored(group.prompt_id, (1.0, 0.0, 1.0, 0.0)[: len(group.keys)]),
            start_weight=0,
            end_weight=0,
        )
        assert tuple(keys) == group.keys, index
        plane.put(keys, columns, tags)


class ScriptedController:
    """Answers ``select`` with the run's groups in chunks of CHUNK; raises SelectTimeout at ``fail_at`` (a call)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.left, self.calls, self.fail_at = all_groups(), 0, fail_at

    def select(self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None):
        """The next chunk, or None once the groups run out."""
        self.calls += 1
        if self.calls == self.fail_at:
            raise SelectTimeout(f"step {trainer_version}: no ready group within {timeout_s} s (scripted)")
        if not self.left:
            return None
        taken, self.left = self.left[:CHUNK], self.left[CHUNK:]
        return taken


def _stream_rank(rank: int, world_size: int, tensor_parallel_size: int, fail_at: int | None, out: Path) -> None:
    """Run the step stream on this rank; save the keys it read, the rows it trained, and the error it ended with."""
    init_model_parallel(tensor_parallel_size)
    plane = CountingPlane()
    fill(plane)
    ranks = RankGroup(timeout_s=120)
    source = LeaderSelect(ScriptedController(fail_at), ranks) if ranks.leader else FollowerSelect(ranks)
    settings = StepSettings(GROUPS_PER_STEP, CHUNK, 60.0, 0, False, True, True)
    versions = iter(range(STEPS + 1))
    version = [next(versions)]
    trained, error = [], None
    try:
        for step in RLStepStream(source, plane, settings, max_steps=STEPS, version=lambda: version[0]):
            for chunk in step.chunks():
                trained.append(len(chunk))
            version[0] = next(versions)
    except (SelectTimeout, LeaderFailed) as err:
        error = f"{type(err).__name__}: {err}"
    torch.save({"read": plane.read, "trained": trained, "error": error}, out / f"rank{rank}.pt")


def results(out: Path, world_size: int) -> list[dict]:
    """What each rank saved."""
    return [torch.load(out / f"rank{rank}.pt") for rank in range(world_size)]


@pytest.mark.slow  # ranks in processes, a minute or more on 2 cores
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("world_size", "tensor_parallel_size"), [(2, 1), (2, 2), (4, 2)], ids=["dp2", "tp2", "tp2xdp2"]
)
def test_each_data_parallel_replica_reads_only_the_rows_it_trains(
    tmp_path: Path, world_size: int, tensor_parallel_size: int
) -> None:
    run_ranks(_stream_rank, world_size, tensor_parallel_size, None, tmp_path)
    every_key = [key for group in all_groups() for key in group.keys]
    seen = results(tmp_path, world_size)
    replicas = [seen[rank : rank + tensor_parallel_size] for rank in range(0, world_size, tensor_parallel_size)]
    for replica in replicas:  # tensor-parallel peers read (and train) the same rows, each exactly once
        assert all(peer["read"] == replica[0]["read"] for peer in replica)
        assert len(set(replica[0]["read"])) == len(replica[0]["read"])
        assert sum(replica[0]["trained"]) == len(replica[0]["read"])
    reads = [replica[0]["read"] for replica in replicas]
    assert sorted(key for read in reads for key in read) == sorted(every_key)  # disjoint, and nothing left out
    if len(replicas) > 1:  # no replica reads a step's rows wholesale: each reads about its share
        assert all(0 < len(read) < len(every_key) * 0.75 for read in reads)
    assert all(rank["error"] is None for rank in seen)


@pytest.mark.slow  # ranks in processes, a minute on 2 cores
@pytest.mark.timeout(600)
def test_a_failed_selection_on_the_leader_ends_every_rank_with_its_error(tmp_path: Path) -> None:
    run_ranks(_stream_rank, 2, 1, 3, tmp_path)  # the third select (step 1's first chunk) times out
    leader, follower = results(tmp_path, 2)
    assert leader["error"].startswith("SelectTimeout: step 1: no ready group")
    assert follower["error"].startswith("LeaderFailed: rank 1: step 1 cannot go on: the leader (rank 0) failed")
    assert "SelectTimeout: step 1: no ready group" in follower["error"]
    assert leader["trained"] and follower["trained"]  # step 0 trained on both before the failure


def test_the_ranks_wait_for_the_leader_as_long_as_its_longest_legitimate_wait() -> None:
    """A select waits up to the stall timeout; a refit may drain (the drain gate), settle a validation and update
    the engine, each up to its own deadline: the metadata group's timeout is the longer of the two plus a minute."""
    from sc_lightning.config import load_config
    from sc_lightning.trainer.rank_sync import leader_wait_s
    from tests.helpers.configs import variant

    def wait(*layers: dict) -> float:
        stall = {"async_rl": {"stall_watchdog": {"stall_timeout_s": 1000.0}}}
        return leader_wait_s(load_config(variant(stall, *layers), extra_top_level=("trainer", "seed_everything")))

    assert wait() == 1000.0 + 60.0  # the stall timeout: a refit's weight update alone (600 s) is shorter
    drain = {"async_rl": {"in_flight_weight_updates": False, "drain_timeout_s": 700.0}}
    validate = {"grpo": {"val_period": 1, "val_timeout_s": 300.0}, "data": {"val_dataset_name": "arithmetic-val"}}
    assert wait(drain, validate) == 700.0 + 300.0 + 600.0 + 60.0
    assert wait(drain, {"policy": {"generation": {"refit_timeout_s": None}}}) == 1000.0 + 60.0
    assert wait(validate) == 1000.0 + 60.0  # in-flight weight updates: no drain, and 300 + 600 s is shorter


def _silent_leader_rank(rank: int, world_size: int, out: Path) -> None:
    """The leader never broadcasts (a hung leader, alive); the follower waits on a group with a 2-s timeout."""
    import time

    torch.distributed.barrier()  # both ranks create the 2-s group together, whichever started faster
    ranks = RankGroup(timeout_s=2.0)
    if ranks.leader:
        time.sleep(6.0)  # alive past the follower's timeout
        return
    started = time.monotonic()
    try:
        FollowerSelect(ranks).select(3, 1, 1)
    except LeaderFailed as err:
        torch.save({"error": str(err), "waited": time.monotonic() - started}, out / "follower.pt")


@pytest.mark.slow  # ranks in processes
@pytest.mark.timeout(300)
def test_a_follower_whose_leader_never_answers_ends_naming_the_step_and_the_leader(tmp_path: Path) -> None:
    run_ranks(_silent_leader_rank, 2, tmp_path)
    seen = torch.load(tmp_path / "follower.pt")
    assert seen["error"].startswith(
        "rank 1: step 3 cannot go on: no selection came from the leader (rank 0), which is hung or gone"
    )
    assert seen["waited"] < 30  # the group's timeout, not forever
