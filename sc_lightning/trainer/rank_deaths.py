"""Why a multi-rank fit failed, in words for its error: which trainer ranks died and how, where the rank that noticed
stood, and, across nodes, a lost connection to another node's rank.

The strategy (:meth:`~sc_lightning.lightning.strategy.MultiRankSingleControllerStrategy.on_exception`) appends these
sentences to the exception. Nothing here imports Lightning: the launcher and the module are read by their attributes
(a launcher's ``procs``, the module's ``trainer`` and the hook name Lightning records in ``_current_fx_name``).
"""

from __future__ import annotations

import signal
import time
from typing import Any


def training_phase(module: Any) -> str:
    """Where the fit stood, from this rank's view: the RL step and the Lightning hook running (``training_step``:
    inside the step; ``on_train_batch_end``: the refit and the bundle after it; none: waiting for a step's rollouts
    or between steps)."""
    if module is None or getattr(module, "_trainer", None) is None:
        return "before training"
    hook = getattr(module, "_current_fx_name", None)  # set by Lightning around every hook and step it calls
    where = f"in {hook}" if hook else "between hooks (waiting for rollouts)"
    return f"at RL step {module.trainer.global_step}, {where}"


def dead_ranks(launcher: Any, *, node_rank: int, ranks_per_node: int, grace_s: float = 2.0) -> str:
    """A sentence naming the ranks this node's launcher started whose process has ended with an error ('' if none).

    A rank that died just now may not have been reaped yet: it waits up to ``grace_s`` for one to show.
    """
    children = getattr(launcher, "procs", None) or []
    deadline = time.monotonic() + grace_s
    while True:
        failed = [(i + 1, child) for i, child in enumerate(children) if child.poll() not in (None, 0)]
        if failed or time.monotonic() >= deadline or not children:
            break
        time.sleep(0.05)
    return "; ".join(
        f"trainer rank {node_rank * ranks_per_node + local} (pid {child.pid}) died: {_exit_reason(child.returncode)}"
        for local, child in failed
    )


LOST_CONNECTION = ("Connection closed by peer", "Connection reset by peer")
"""How gloo words a collective whose peer process has ended."""


def lost_peer(exception: BaseException, *, node_rank: int, num_nodes: int) -> str:
    """With several nodes, a sentence for a collective broken by a lost connection: a rank of another node may have
    ended, and that node's output says why ('' for one node or another error)."""
    if num_nodes == 1 or not any(words in str(exception) for words in LOST_CONNECTION):
        return ""
    others = ", ".join(str(node) for node in range(num_nodes) if node != node_rank)
    return (
        f"node {node_rank} lost its connection to another trainer rank: if a rank of another node (node {others}) "
        "ended, that node's output says why"
    )


def _exit_reason(returncode: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"
