"""One controller, many trainer ranks: how every rank learns which groups a step trains.

The controller (and the data plane's owner, and the engines) live on the leader, global rank 0. Whenever the step
stream selects groups, the leader asks the controller and broadcasts the answer — group metadata (data-plane keys,
lengths, versions), never rows — to every rank over a CPU (gloo) process group; each rank then reads its own share
of the rows from the data plane by key (:func:`~sc_lightning.trainer.data_parallel.share_of_groups`). A failure of
the leader's call is broadcast too, so every rank ends with the leader's error instead of waiting for a step that
will never come; a stop signal that ends the leader's wait (WaitInterrupted) ends every rank's the same way. The
group's timeout is the deadline of every wait on it; a rank that dies breaks the group's connections, and the
others' next call on it fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed

from sc_lightning.config import SCConfig
from sc_lightning.controller.api import ControllerClient, GroupMeta, WaitInterrupted
from sc_lightning.trainer.parent_watch import watch_parent

LEADER = 0
"""The global rank that owns the controller, the data plane and the engines."""


def leader_wait_s(config: SCConfig) -> float:
    """How long a rank waits for the leader on the metadata group: the longest the leader may legitimately take
    between two of its broadcasts, plus a minute. That is a select waiting for rollouts (up to the stall timeout) or
    a refit, whose drain (the drain gate's), validation settling and weight update each have a deadline of their
    own; a wait past them all is a dead or hung leader."""
    runtime, algo = config.async_rl, config.algo
    refit = [
        None if runtime.in_flight_weight_updates else runtime.drain_timeout_s,
        algo.val_timeout_s if algo.validates() else None,
        config.policy.generation.refit_timeout_s,
    ]
    return max(runtime.stall_watchdog.stall_timeout_s, sum(part for part in refit if part is not None)) + 60.0


class LeaderFailed(RuntimeError):
    """The leader rank's call failed; raised on the other ranks with the leader's error in the message."""


@dataclass
class _Failure:
    """A leader-side error, as broadcast to the other ranks."""

    kind: str
    message: str


class RankGroup:
    """The trainer ranks' metadata channel: a gloo group over every rank, the leader at rank 0."""

    def __init__(self, timeout_s: float) -> None:
        """Create the group (a collective: every rank calls it); ``timeout_s`` bounds every wait on it. A rank other
        than the leader also ends when its parent process does (:func:`~sc_lightning.trainer.parent_watch.
        watch_parent`), instead of waiting out the timeout."""
        self.group = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.rank = torch.distributed.get_rank()
        self.size = torch.distributed.get_world_size()
        if not self.leader:
            watch_parent(self.rank)

    @property
    def leader(self) -> bool:
        """Whether this rank owns the controller."""
        return self.rank == LEADER

    def broadcast(self, obj: Any = None) -> Any:
        """The leader's ``obj`` on every rank (the others pass nothing)."""
        box = [obj if self.leader else None]
        torch.distributed.broadcast_object_list(box, src=LEADER, group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` (in rank order) on the leader; None on the others."""
        out: list[Any] | None = [None] * self.size if self.leader else None
        torch.distributed.gather_object(obj, out, dst=LEADER, group=self.group)
        return out


class LeaderSelect:
    """The leader's side of ``select``: ask the controller, then broadcast its answer (or its error)."""

    def __init__(self, client: ControllerClient, ranks: RankGroup) -> None:
        self.client, self.ranks = client, ranks

    def select(
        self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None
    ) -> list[GroupMeta] | None:
        """The controller's selection, shared with every rank."""
        try:
            groups = self.client.select(trainer_version, min_groups, max_groups, timeout_s=timeout_s)
        except Exception as err:
            self.ranks.broadcast(_Failure(type(err).__name__, str(err)))
            raise
        return self.ranks.broadcast(groups)


class FollowerSelect:
    """A non-leader rank's side of ``select``: wait for the leader's answer."""

    def __init__(self, ranks: RankGroup) -> None:
        self.ranks = ranks

    def select(
        self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None
    ) -> list[GroupMeta] | None:
        """The groups the leader's controller selected for ``trainer_version``; LeaderFailed if its call failed, or if
        no answer came (the group's timeout passed, or the leader's connection broke)."""
        try:
            answer = self.ranks.broadcast()
        except RuntimeError as err:  # gloo's own error says which: a timeout, or a connection closed by the peer
            raise LeaderFailed(
                f"rank {self.ranks.rank}: step {trainer_version} cannot go on: no selection came from the leader (rank "
                f"{LEADER}), which is hung or gone (its output says why): {type(err).__name__}: {err}"
            ) from err
        if isinstance(answer, _Failure) and answer.kind == WaitInterrupted.__name__:
            raise WaitInterrupted(answer.message)
        if isinstance(answer, _Failure):
            raise LeaderFailed(
                f"rank {self.ranks.rank}: step {trainer_version} cannot go on: the leader (rank {LEADER}) failed to "
                f"select its groups: {answer.kind}: {answer.message}"
            )
        return answer
