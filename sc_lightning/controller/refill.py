"""What takes a slot whose prompt group ended without a commit: a spare, a fresh prompt, or nothing.

A group whose retries are spent is dropped within the drop budgets (``drops.py``): a spare from the replacement
reserve takes its place (``reserve.py``), or its step shrinks. With dynamic sampling a group whose rewards are all
equal is filtered and a fresh prompt takes its slot (``dynamic_sampling.py``). Either way the replacement keeps the
slot's permits and its ledger sequence, so a checkpoint cut sees one pending group per slot.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from sc_lightning.controller.drops import DropLedger
from sc_lightning.controller.dynamic_sampling import refill_prompt
from sc_lightning.controller.ledger import RecoveryLedger
from sc_lightning.controller.parts import ControllerParts
from sc_lightning.controller.recovery import PendingGroup, RecoveryPolicy
from sc_lightning.rollout.failures import classify
from sc_lightning.rollout.manager import GroupFiltered, RolloutError

log = logging.getLogger(__name__)


class SlotRefill:
    """Decides the replacement of a dropped or filtered group, and records it in the drop and recovery ledgers."""

    def __init__(
        self,
        parts: ControllerParts,
        recovery: RecoveryPolicy,
        drops: DropLedger,
        ledger: RecoveryLedger,
        notify: Callable[[], Awaitable[None]],
    ) -> None:
        self.parts, self.recovery, self.drops, self.ledger = parts, recovery, drops, ledger
        self._notify = notify  # wakes the controller's waiters (a step lent a group may be complete)

    async def after_drop(
        self, failure: RolloutError, entry: PendingGroup, spares: int, sequence: int, trainer_version: int
    ) -> PendingGroup | None:
        """Drop a group whose retries are spent (or stop the run if its budget is spent); its replacement, if any.

        A spare is taken only for a stamped step not trained yet; if a ready group of a later step exists, it is
        lent to the dropped group's step (which can then close at once) and the spare goes to the lender's step.
        """
        self.drops.allow_drop(failure, classify(failure))  # raises when the drop budget is spent
        log.warning("dropped a prompt group within the drop budget: %s", failure)
        target = entry.target_step
        spare = None if target is None or target < trainer_version else self.parts.reserve.take(spares)
        if spare is None:
            self.ledger.forget(sequence)  # dropped on purpose: a checkpoint must not redispatch it
            self.drops.shrink(target, trainer_version, entry.prompt.prompt_id)  # raises below the floor
            return None
        assert target is not None
        lent = self.parts.buffer.promote_ready_group(to_target_step=target)
        if lent is not None:
            group_id, lender_step = lent
            self.drops.promoted(target)
            self.ledger.retarget(group_id, target)
            target = lender_step
            await self._notify()  # the borrowing step may be complete now
        replacement = self.recovery.pending(spare, target)
        self.ledger.replace(sequence, replacement)
        return replacement

    def after_filter(
        self, filtered: GroupFiltered, entry: PendingGroup, sequence: int, trainer_version: int
    ) -> PendingGroup | None:
        """Dynamic sampling: the filtered prompt is consumed; a fresh one takes its slot (None: none left, the step
        closes one group short). Raises DynamicSamplingCapExceeded past the step's cap. No await: one cut."""
        dynamic = self.parts.dynamic_sampling
        assert dynamic is not None
        target = entry.target_step
        stale = target is not None and target < trainer_version  # its step closed already: nothing waits for it
        step = trainer_version if target is None or stale else target
        dynamic.filtered(step, filtered, entry.prompt.index)
        if not stale:
            dynamic.check_cap(step, filtered)
        prompt = None if stale else refill_prompt(self.parts.reserve, self.parts.prompts)
        if prompt is None:
            self.ledger.forget(sequence)
            if target is not None and not stale:
                self.drops.shortfall[target] += 1
                log.warning("step %d: %s; no prompt left to refill it, the step shrinks", step, filtered)
            return None
        dynamic.refilled(step)
        refill = self.recovery.pending(prompt, entry.target_step)
        self.ledger.replace(sequence, refill)
        return refill
