"""The multi-rank tests' launcher fails loudly: a rank's error names the rank, hung ranks meet the deadline."""

from __future__ import annotations

import pytest
import torch.distributed
from torch.multiprocessing import ProcessRaisedException

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
