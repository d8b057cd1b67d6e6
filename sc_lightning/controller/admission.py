"""Admission: what a prompt group holds while its rollout runs, as one :class:`Slot` with one way in and one way out.

A slot is a buffer permit (``async_rl.max_buffered_rollouts``), an in-flight permit (``async_rl.max_inflight_prompts``)
and a pass through the dispatch gate (closed while a refit runs), taken in that order by :meth:`Admission.acquire`.
It ends once, by :meth:`Slot.release`, which gives back whatever the slot holds: the in-flight permit, the gate pass
and — unless the group committed (:meth:`Slot.commit`) — the buffer permit. A committed group keeps its buffer permit
until it is selected or evicted (:meth:`Admission.release_committed`). The recovery ledger's ``holding_permit`` marks
the pending groups whose slot holds a buffer permit, for the checkpoint cut.
"""

from __future__ import annotations

from sc_lightning.controller.dispatch_gate import DispatchGate
from sc_lightning.controller.ledger import RecoveryLedger
from sc_lightning.controller.permits import Permits


class Admission:
    """The buffer permits, the in-flight permits and the dispatch gate, handed out together as slots."""

    def __init__(self, max_buffered_rollouts: int, max_inflight_prompts: int, ledger: RecoveryLedger) -> None:
        self.buffer_permits = Permits(max_buffered_rollouts, "async_rl.max_buffered_rollouts")
        self.inflight_permits = Permits(max_inflight_prompts, "async_rl.max_inflight_prompts")
        self.gate = DispatchGate()
        self.ledger = ledger

    async def acquire(self, sequence: int) -> Slot:
        """Wait for a buffer permit, an in-flight permit and an open gate for the pending group ``sequence``.

        Cancelled while waiting, it gives back what it took.
        """
        slot = Slot(self, sequence)
        try:
            await self.buffer_permits.acquire()
            slot.holds_buffer_permit = True
            self.ledger.holding_permit.add(sequence)
            await self.inflight_permits.acquire()
            slot.holds_inflight_permit = True
            await self.gate.enter()
            slot.through_gate = True
        except BaseException:
            slot.release()
            raise
        return slot

    def release_committed(self, count: int) -> None:
        """``count`` committed groups left the buffer (selected or evicted): their buffer permits come back."""
        self.buffer_permits.release(count)


class Slot:
    """One launched group's permits and gate pass, from :meth:`Admission.acquire` to :meth:`release`."""

    def __init__(self, admission: Admission, sequence: int) -> None:
        self.sequence = sequence  # the pending group's dispatch sequence in the recovery ledger
        self.holds_buffer_permit = False
        self.holds_inflight_permit = False
        self.through_gate = False  # counted by the dispatch gate as generating
        self._admission = admission
        self._committed = False

    async def pass_gate_again(self) -> None:
        """A spare takes a dropped group's place: it leaves the gate and passes it afresh (a refit may be draining)."""
        gate = self._admission.gate
        gate.leave()
        self.through_gate = False
        await gate.enter()
        self.through_gate = True

    def commit(self) -> None:
        """The group committed: its buffer permit now belongs to the committed group, not to this slot."""
        self._committed = True

    def release(self) -> None:
        """End the slot (committed, failed, cancelled or never started): give back what it holds; then a no-op."""
        admission = self._admission
        if self.holds_inflight_permit:
            self.holds_inflight_permit = False
            admission.inflight_permits.release()
        if self.through_gate:
            self.through_gate = False
            admission.gate.leave()
        if self.holds_buffer_permit:  # a committed group holds it now, not a pending one
            self.holds_buffer_permit = False
            admission.ledger.holding_permit.discard(self.sequence)
            if not self._committed:
                admission.buffer_permits.release()
