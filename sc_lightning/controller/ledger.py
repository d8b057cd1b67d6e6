"""The recovery ledger: every prompt group taken from the dataset and not yet trained, by where it stands.

    pending    taken from the stream, not committed: in flight, or waiting for its permits (by dispatch sequence;
               ``holding_permit`` marks the launched ones, which hold a buffer permit)
    committed  in the buffer or claimed, with the entry that regenerates it (by group id)
    claims     selected by the step being trained; released when that step publishes its weights
    resumed    a restored checkpoint's pending groups, dispatched first by the next pump

The rollout pump writes it as groups move; the checkpoint code reads it for a cut and fills ``resumed`` on a
restore. Every prompt taken from the stream is trained, claimed, committed or pending: a resume loses none and
repeats none. ``claims_lock`` keeps the claims (and the trainer version that releases them) still during a cut.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable, Sequence

from sc_lightning.controller.api import GroupMeta
from sc_lightning.controller.recovery import PendingGroup

log = logging.getLogger(__name__)


class RecoveryLedger:
    """Pending, committed, claimed and resumed prompt groups, shared by the rollout pump and the checkpoint code."""

    def __init__(self) -> None:
        self.pending: dict[int, PendingGroup] = {}
        self.holding_permit: set[int] = set()
        self.committed: dict[str, PendingGroup] = {}
        self.claims: list[GroupMeta] = []
        self.resumed: list[PendingGroup] = []
        self.claims_lock = asyncio.Lock()
        self._sequence = itertools.count()

    # ---------------------------------------------------------------------------------------- the pump's side

    def open_resumed(self) -> list[tuple[int, PendingGroup]]:
        """The restored pending groups as pending again, sequenced -n..-1 so they sort before any new one."""
        resumed, self.resumed = self.resumed, []
        opened = list(zip(range(-len(resumed), 0), resumed, strict=True))
        self.pending.update(opened)
        return opened

    def open(self, entries: Sequence[PendingGroup]) -> list[tuple[int, PendingGroup]]:
        """New pending groups (a batch just admitted), with their dispatch sequences."""
        opened = [(next(self._sequence), entry) for entry in entries]
        self.pending.update(opened)
        return opened

    def replace(self, sequence: int, entry: PendingGroup) -> None:
        """A spare takes a dropped group's place in its slot."""
        self.pending[sequence] = entry

    def forget(self, sequence: int) -> None:
        """A pending group dropped on purpose (aborted as doomed, or dropped within budget): never redispatched."""
        self.pending.pop(sequence, None)

    def commit(self, sequence: int, group_id: str, entry: PendingGroup) -> None:
        """A pending group committed to the buffer as ``group_id`` (no await between this and the commit)."""
        self.pending.pop(sequence, None)
        self.committed[group_id] = entry

    def retarget(self, group_id: str, target_step: int) -> None:
        """A committed group lent to another step (replacement promotion)."""
        if group_id in self.committed:
            self.committed[group_id].target_step = target_step

    def claim(self, groups: Iterable[GroupMeta]) -> None:
        """Groups selected for the step being trained."""
        self.claims.extend(groups)

    def release_claims(self) -> list[GroupMeta]:
        """The trained step's claims, now done with (their entries leave the ledger)."""
        claims, self.claims = self.claims, []
        self.drop_committed(claims)
        return claims

    def drop_committed(self, groups: Iterable[GroupMeta]) -> None:
        """Committed groups that left for good (trained or evicted)."""
        for group in groups:
            self.committed.pop(group.group_id, None)

    # ------------------------------------------------------------------------------------ the checkpoint's side

    def pending_in_order(self) -> list[PendingGroup]:
        """The pending groups in dispatch order (restored ones first)."""
        return [entry for _, entry in sorted(self.pending.items())]

    def pending_holding_permits(self) -> int:
        """How many pending groups were launched (hold a buffer permit); the others wait for one."""
        return len(self.holding_permit & self.pending.keys())

    def regenerable(self, group_ids: Sequence[str]) -> list[PendingGroup]:
        """The entries that regenerate committed groups a cut without rows leaves out (unknown ones are logged)."""
        unknown = [group_id for group_id in group_ids if group_id not in self.committed]
        if unknown:  # restored from a replay index by a capable sampler: no prompt to regenerate them from
            log.warning("checkpoint without rows: groups %s cannot be regenerated and are left out", unknown)
        return [self.committed[group_id] for group_id in group_ids if group_id in self.committed]
