"""The SingleController's checkpoint collaborator: a consistent cut of its state, and restoring one before start.

A cut holds the trainer's version, the prompt stream's cursor, the sampler's dispatch index, the replay index of
the committed groups (claimed by the step being trained, then buffered) — their rows are the data plane's own
snapshot — the pending prompt groups (taken from the stream, not committed), the drop budgets spent with the
shortfalls of open steps, the replacement reserve (dynamic sampling's spares too) and dynamic sampling's counts.
It is taken behind :meth:`ControllerCheckpoint.barrier`, so rows, index and ledgers describe the same moment while
generation goes on. The controller owns one :class:`ControllerCheckpoint` over its parts, its buffer permits and its
:class:`~sc_lightning.controller.ledger.RecoveryLedger`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sc_lightning.config.resume_rules import (
    CONTROLLER_STATE_VERSION,
    check_buffer_capacity,
    check_format,
    held_permits,
)
from sc_lightning.controller.buffer import replay_index
from sc_lightning.controller.ledger import RecoveryLedger
from sc_lightning.controller.recovery import PendingGroup, RecoveryPolicy

if TYPE_CHECKING:
    from sc_lightning.controller.drops import DropLedger
    from sc_lightning.controller.parts import ControllerParts
    from sc_lightning.controller.permits import Permits


@dataclass
class ControllerCheckpoint:
    """Cuts and restores the controller's state: the parts it reads, and the recovery ledger it shares with the pump."""

    parts: ControllerParts  # the buffer, the sampler's dispatch index, the prompt stream, the reserve, dynamic sampling
    recovery: RecoveryPolicy
    drops: DropLedger
    buffer_permits: Permits
    ledger: RecoveryLedger

    @contextlib.asynccontextmanager
    async def barrier(self) -> AsyncIterator[None]:
        """Inside: trainer_version, the claims, the committed groups and the data plane's rows stay put.

        It holds the claims lock (no refit releases a step's claims or deletes rows) and the buffer's commit
        barrier (finished groups wait to commit); generation and dispatch go on.
        """
        async with self.ledger.claims_lock, self.parts.buffer.commits_paused():
            yield

    def state(self, trainer_version: int, *, index_rows: bool = True) -> dict[str, Any]:
        """Everything but the rows a resume needs: JSON-able plain data, for the trainer state of ``trainer_version``.

        The trainer's version, the prompt stream's cursor, the sampler's dispatch index, the replay index of the
        committed groups — the claimed ones (selected by the step being trained, ``claimed`` of them, first) and
        the buffered ones; their rows are the data plane's own snapshot — and the *pending* prompts — taken from the
        stream but not committed (in flight or waiting for permits; the first ``pending_holding_permits`` of them
        were launched and held buffer permits) — with their target steps. Every prompt taken
        from the stream is thus trained already (by a step of ``trainer_version``'s checkpoint), claimed, buffered,
        or pending: none is lost or repeated by a resume.

        Without ``index_rows`` the replay index is empty and the claimed and buffered groups come first in the
        pending list instead (their rows will not be restored; with token capture their sealed generations are).
        """
        ledger, dynamic = self.ledger, self.parts.dynamic_sampling
        pending, holding = ledger.pending_in_order(), ledger.pending_holding_permits()
        if index_rows:
            index = self.parts.buffer.state_dict(claimed=ledger.claims)
        else:
            claims = [meta.group_id for meta in ledger.claims]
            buffered = [meta.group_id for meta in self.parts.buffer.ready_metas()]
            pending = ledger.regenerable(claims + buffered) + pending
            holding += sum(group_id in ledger.committed for group_id in buffered)  # buffered groups held permits too
            index = replay_index([])
        return {
            "version": CONTROLLER_STATE_VERSION,
            "trainer_version": trainer_version,
            "prompts": self.parts.prompts.state_dict(),
            "dispatch_index": self.parts.sampler.dispatch_index,
            "replay_index": index,
            "claimed": len(ledger.claims),
            "rows_indexed": index_rows,
            "pending": [entry.to_dict() for entry in pending],
            "pending_holding_permits": holding,
            "drops": self.drops.state_dict(),
            "replacement_reserve": self.parts.reserve.state_dict(),
            "dynamic_sampling": None if dynamic is None else dynamic.state_dict(),
        }

    async def snapshot(self, directory: str | Path | None, trainer_version: Callable[[], int]) -> dict[str, Any]:
        """Write the data plane's rows into ``directory`` and return :meth:`state` — at any moment.

        Behind the :meth:`barrier`, so the rows and the replay index describe the same committed groups (and
        ``trainer_version()`` is read inside it). The state indexes the rows when the sampler
        ``supports_buffer_checkpoint``; otherwise (shadow mode), or with ``directory`` None (no rows saved), the
        claimed and buffered groups are listed as pending to regenerate. Evicted groups' rows may be saved without
        being indexed; :meth:`restore` drops such orphans.
        """
        async with self.barrier():
            if directory is not None:
                await asyncio.to_thread(self.parts.buffer.data_plane.save, directory)
            index_rows = directory is not None and self.parts.sampler.supports_buffer_checkpoint
            return self.state(trainer_version(), index_rows=index_rows)

    async def restore(self, state: dict[str, Any], *, group_size: int) -> int:
        """Load a :meth:`state` (the committed groups' rows already in the data plane); returns its trainer version.

        Raises ResumeMismatch naming what does not fit (state version, prompt stream settings, replay index,
        capacity: the rules of :mod:`~sc_lightning.config.resume_rules`).
        """
        check_format("controller state", state, CONTROLLER_STATE_VERSION)
        pending = [PendingGroup.from_dict(p, capture=self.recovery.token_capture) for p in state["pending"]]
        groups, claimed = len(state["replay_index"]["groups"]), int(state.get("claimed", 0))
        buffered, dispatched = held_permits(state)  # what held buffer permits at the cut
        check_buffer_capacity(buffered=buffered, dispatched=dispatched, capacity=self.buffer_permits.total)
        self.parts.prompts.load_state_dict(state["prompts"])
        self.drops.load_state_dict(state.get("drops", {}))
        self.parts.reserve.load_state_dict(state.get("replacement_reserve", []))
        if self.parts.dynamic_sampling is not None:
            self.parts.dynamic_sampling.load_state_dict(state.get("dynamic_sampling") or {})
        self.parts.sampler.restore_dispatch_index(int(state["dispatch_index"]))
        self.parts.buffer.load_state_dict(
            state["replay_index"], max_groups=self.buffer_permits.total + claimed, expected_group_size=group_size
        )
        # the restored groups hold permits until selected or evicted; claimed ones (a step caught mid-way) were
        # over the budget already, so dispatch waits until they are trained again
        await self.buffer_permits.take_without_waiting(groups)
        indexed = {key for group in state["replay_index"]["groups"] for key in group["keys"]}
        stored = await asyncio.to_thread(self.parts.buffer.data_plane.keys)
        orphans = [key for key in stored if key not in indexed]
        if orphans:  # rows of groups evicted before the snapshot, not deleted yet
            await asyncio.to_thread(self.parts.buffer.data_plane.clear, orphans)
        self.ledger.resumed = pending
        return int(state["trainer_version"])
