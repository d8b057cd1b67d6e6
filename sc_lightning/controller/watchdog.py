"""StallWatchdog: a run that makes no progress for ``stall_timeout_s`` is reported (warn) or ended (abort).

Progress is a committed prompt group or a completed train step (the controller's ``idle_s``). Every
``interval_s`` the watchdog, a background task on the controller's loop, compares it with
``async_rl.stall_watchdog.stall_timeout_s``; a stall names where the run stands — trainer version, dispatch
index, groups in flight, ready and buffered, permits held. With ``stall_action: abort`` it raises
:class:`RolloutStall`, which the trainer's next call to the controller raises in turn; with ``warn`` it logs once
per stall. A finished dataset with nothing in flight is not a stall.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)


class RolloutStall(RuntimeError):
    """Nothing committed and no step completed for stall_timeout_s; the message says where the run stands."""


@dataclass
class StallWatchdog:
    """Checks the controller's progress every ``interval_s`` (settings from ``async_rl.stall_watchdog``)."""

    interval_s: float
    stall_timeout_s: float
    action: Literal["warn", "abort"]
    warnings: int = 0

    async def run(self, controller: Any) -> None:
        """Check until cancelled; raise RolloutStall on a stall in abort mode."""
        stalled = False
        while True:
            await asyncio.sleep(self.interval_s)  # the check's cadence (a timer, not a synchronisation)
            stats = controller.stats()
            if stats.idle_s < self.stall_timeout_s or (stats.exhausted and stats.inflight == 0):
                stalled = False
                continue
            message = (
                f"no prompt group committed and no train step completed for {stats.idle_s:.0f} s "
                f"(async_rl.stall_watchdog.stall_timeout_s={self.stall_timeout_s}): trainer at weight version "
                f"{stats.trainer_version}, dispatch index {stats.dispatch_index}, {stats.inflight} group(s) in flight, "
                f"{stats.ready} ready of {stats.buffered} buffered, {stats.buffer_permits_held} buffer permit(s) held"
            )
            if self.action == "abort":
                raise RolloutStall(message)
            if not stalled:
                log.warning("stall: %s", message)
                self.warnings += 1
                stalled = True
