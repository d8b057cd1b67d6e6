"""The multi-rank tests' launcher fails loudly: a rank's error or death names the rank, hung ranks meet the deadline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch.distributed
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from tests.ranks import run_ranks


def _second_rank_fails(rank: int, world_size: int) -> None:
    """Rank 1 raises after both ranks met once."""
    torch.distributed.barrier()
    if rank == 1:
        raise RuntimeError(f"rank {rank} of {world_size} broke")


def _ranks_wait_for_each_other(rank: int, world_size: int) -> None:
    """Rank 0 waits in a barrier that rank 1 never joins, rank 1 for a tensor that rank 0 never sends."""
    if rank == 0:
        torch.distributed.barrier()
    else:
        torch.distributed.recv(torch.zeros(1), src=0)


@pytest.mark.slow  # ranks in processes, about 15 s on 2 cores
def test_a_failing_rank_fails_the_run_with_its_index_and_error() -> None:
    with pytest.raises(ProcessRaisedException, match=r"(?s)Process 1 terminated.*rank 1 of 2 broke"):
        run_ranks(_second_rank_fails, 2)


def test_ranks_that_hang_are_killed_at_the_deadline_and_named() -> None:
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] of 2 still running after 10 s"):
        run_ranks(_ranks_wait_for_each_other, 2, timeout_s=10)


def _second_rank_dies(rank: int, world_size: int) -> None:
    """Rank 1's process ends with exit code 3 (as a crash would), rank 0 returns."""
    if rank == 1:
        os._exit(3)


def test_a_rank_that_dies_fails_the_run_with_its_index_and_exit_code_and_the_next_run_starts_fresh() -> None:
    with pytest.raises(ProcessExitedException, match=r"process 1 terminated with exit code 3"):
        run_ranks(_second_rank_dies, 2, timeout_s=60)
    run_ranks(_both_meet, 2)


def _both_meet(rank: int, world_size: int) -> None:
    """Both ranks meet once (the pool that lost a rank was retired: these are new processes)."""
    torch.distributed.barrier()


def _threads_after_model_parallel(rank: int, world_size: int, out: str) -> None:
    """Set up megatron's TP=2 groups (as the multi-rank tests do) and report this rank's native thread count."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    torch.distributed.barrier()
    with open(f"{out}.{rank}", "a") as counts:
        counts.write(f"{len(os.listdir('/proc/self/task'))}\n")


@pytest.mark.slow  # ranks in processes
def test_a_pool_rank_holds_no_more_threads_after_many_functions_than_after_one(tmp_path) -> None:
    """Every function's process groups are destroyed before the next (megatron's reset leaves them): a rank's gloo
    threads do not pile up over the functions it serves."""
    out = str(tmp_path / "threads")
    for _ in range(6):
        run_ranks(_threads_after_model_parallel, 2, out)
    for rank in range(2):
        counts = [int(line) for line in Path(f"{out}.{rank}").read_text().split()]
        assert counts[-1] <= counts[1], counts  # the first call may start torch's own threads once
