"""The multi-rank tests' launcher: a function run on N real processes joined in one gloo process group.

The processes of one world size start once per test process and then serve one function after another (a rank pool):
starting a rank (a Python process importing torch and megatron-core, then joining the group) took about as long as
many of the functions it ran. Before each function every rank resets what a fresh process would not have: megatron's
parallel state, torch's default seed, the environment and the working directory. A rank that fails, a rank that dies
and a call past its deadline retire the pool (its processes are killed); the next call starts new ones. A rank
whose test process is gone ends itself.
"""

from __future__ import annotations

import atexit
import multiprocessing.connection
import os
import queue
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed
import torch.multiprocessing
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from sc_lightning.models.megatron_import import import_megatron_without_compile

# A spawned rank imports this module before the test module that holds its function (which imports megatron-core):
# megatron then comes without TorchInductor or wandb, as in the CLI's processes (a few seconds of every rank's start).
import_megatron_without_compile()

_POOLS: dict[int, _RankPool] = {}
"""This process's rank pools by world size."""


def run_ranks(fn: Callable[..., None], world_size: int, *args: Any, timeout_s: float = 300.0) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes joined in one gloo group; return when all did.

    A rank that raises fails the call with its traceback and index (torch's ``ProcessRaisedException``), one that
    dies with its exit code (``ProcessExitedException``); past ``timeout_s`` every rank is killed and the call fails
    naming the ranks still running. ``fn`` and ``args`` must pickle (a module-level function).
    """
    pool = _POOLS.get(world_size)
    if pool is None:
        pool = _POOLS[world_size] = _RankPool(world_size)
    try:
        pool.run(fn, args, timeout_s)
    except BaseException:
        del _POOLS[world_size]
        pool.retire()
        raise


@atexit.register
def _retire_all() -> None:
    """At exit (before multiprocessing joins its children): kill every pool's ranks."""
    while _POOLS:
        _POOLS.popitem()[1].retire()


class _RankPool:
    """``world_size`` spawned rank processes in one gloo group, each taking functions from its own pipe."""

    def __init__(self, world_size: int) -> None:
        context = torch.multiprocessing.get_context("spawn")
        self.world_size = world_size
        self._store = tempfile.mkdtemp(prefix="sc-ranks-")
        self._results = context.Queue()
        self._inboxes: list[multiprocessing.connection.Connection] = []
        self._processes = []
        init_method = f"file://{self._store}/rendezvous"
        for rank in range(world_size):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_serve,
                args=(rank, world_size, init_method, receive, self._results, os.getpid()),
                name=f"rank{rank}",
            )
            process.start()
            receive.close()
            self._inboxes.append(send)
            self._processes.append(process)

    def run(self, fn: Callable[..., None], args: tuple, timeout_s: float) -> None:
        """Run ``fn`` on every rank and wait for all of them (see :func:`run_ranks` for the failures)."""
        for inbox in self._inboxes:
            inbox.send((fn, args))
        deadline = time.monotonic() + timeout_s
        running = set(range(self.world_size))
        while running:
            left = deadline - time.monotonic()
            if left <= 0:
                still = sorted(running)
                raise TimeoutError(f"ranks {still} of {self.world_size} still running after {timeout_s:.0f} s")
            try:
                rank, error = self._results.get(timeout=min(1.0, left))
            except queue.Empty:
                self._check_alive()
                continue
            if error is not None:
                message = f"\n\n-- Process {rank} terminated with the following error:\n{error}"
                raise ProcessRaisedException(message, rank, self._processes[rank].pid)
            running.discard(rank)

    def _check_alive(self) -> None:
        """Raise ``ProcessExitedException`` for the first rank process that has ended."""
        for rank, process in enumerate(self._processes):
            if process.exitcode is not None:
                raise ProcessExitedException(
                    f"process {rank} terminated with exit code {process.exitcode}",
                    error_index=rank,
                    error_pid=process.pid,
                    exit_code=process.exitcode,
                )

    def retire(self) -> None:
        """Kill the rank processes and remove the rendezvous directory."""
        for process in self._processes:
            process.kill()
        for process in self._processes:
            process.join(timeout=10)
        shutil.rmtree(self._store, ignore_errors=True)


def _serve(
    rank: int,
    world_size: int,
    init_method: str,
    inbox: multiprocessing.connection.Connection,
    results: Any,
    parent: int,
) -> None:
    """One rank: join the group, then run each function received, from a fresh process's state, and report how it
    ended; ends when the pipe closes or the test process is gone."""
    torch.distributed.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    environment, directory, seed = dict(os.environ), os.getcwd(), torch.initial_seed()
    while True:
        while not inbox.poll(1.0):
            if os.getppid() != parent:
                return
        try:
            fn, args = inbox.recv()
        except EOFError:
            return
        _as_fresh(environment, directory, seed, world_size)
        try:
            fn(rank, world_size, *args)
        except BaseException:
            results.put((rank, traceback.format_exc()))
        else:
            results.put((rank, None))


def _as_fresh(environment: dict[str, str], directory: str, seed: int, world_size: int) -> None:
    """Undo what a function run before may have left: megatron's parallel state (sizes, seeds) and process groups,
    torch's default seed and threads, the environment and the working directory."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    _destroy_subgroups()
    torch.manual_seed(seed)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # the machine's cores shared out
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(directory)


def _destroy_subgroups() -> None:
    """Destroy every process group but the rank's own world.

    megatron's ``destroy_model_parallel`` forgets its groups without destroying them, and each gloo group keeps two
    threads per peer polling its sockets: a pool rank that served a few hundred functions held over a thousand such
    threads, and the idle rank processes took a third of a core each for the rest of the suite.
    """
    world = torch.distributed.GroupMember.WORLD
    for group in list(torch.distributed.distributed_c10d._world.pg_map):  # torch keeps no public list of groups
        if group is not world:
            torch.distributed.destroy_process_group(group)
