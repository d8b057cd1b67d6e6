"""The multi-rank tests' launcher: a function run on N real processes joined in one gloo process group."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed
import torch.multiprocessing

from sc_lightning.models.megatron_import import import_megatron_without_compile

# A spawned rank imports this module before the test module that holds its function (which imports megatron-core):
# megatron then comes without TorchInductor or wandb, as in the CLI's processes (a few seconds of every rank's start).
import_megatron_without_compile()


def run_ranks(fn: Callable[..., None], world_size: int, *args: Any, timeout_s: float = 300.0) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes after each joins a gloo group.

    A rank that raises fails the call with its traceback and index (torch's ``ProcessRaisedException``); past
    ``timeout_s`` every rank is killed and the call fails naming the ranks still running.
    """
    with tempfile.TemporaryDirectory() as store:
        context = torch.multiprocessing.start_processes(
            _rank_main,
            args=(fn, world_size, f"file://{store}/rendezvous", args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                running = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"ranks {running} of {world_size} still running after {timeout_s:.0f} s")


def _rank_main(rank: int, fn: Callable[..., None], world_size: int, init_method: str, args: tuple) -> None:
    """One rank: join the group, run ``fn``, leave the group (the machine's cores shared out among the ranks)."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    torch.distributed.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        torch.distributed.destroy_process_group()
