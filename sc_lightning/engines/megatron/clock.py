"""Active time of a generation engine: a clock that stops while the engine is stood down, and deadlines on it.

A colocated engine stands down for the whole train step; the requests it holds freeze, and their per-request
deadlines (``generation_timeout_s``, ``rollout_timeout_s``) must not run out meanwhile. :class:`ActiveClock` counts
only the seconds the engine is awake; :meth:`ActiveClock.deadline` is ``asyncio.timeout`` measured on that clock,
and :meth:`ActiveClock.wait_for` is ``asyncio.wait_for`` measured on it. Both raise ``TimeoutError`` on expiry.

    async with engine.active_deadline(30.0):      # instead of: async with asyncio.timeout(30.0)
        generation = await engine.generate(prompt, sampling)
    generation = await engine.active_wait_for(engine.generate(prompt, sampling), 30.0)   # instead of wait_for

The clock is driven from the event loop (``pause`` on ``stand_down``, ``resume`` on ``wake``), and deadlines must
be entered on that same loop. A deadline may cover any awaitable, e.g. a whole rollout of several generations.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class _Deadline:
    """One entered deadline: the ``asyncio.Timeout`` it drives and the active-clock reading at which it expires."""

    timeout: asyncio.Timeout
    expires_at: float


class ActiveClock:
    """Seconds during which an engine was awake: a monotonic clock that stops between ``pause`` and ``resume``."""

    def __init__(self, time_fn: Callable[[], float] = time.monotonic) -> None:
        self._time = time_fn
        self._start = time_fn()
        self._paused_at: float | None = None
        self._paused_total = 0.0
        self._deadlines: set[_Deadline] = set()

    @property
    def running(self) -> bool:
        """Whether the clock is counting (the engine is awake)."""
        return self._paused_at is None

    def now(self) -> float:
        """Active seconds since the clock was created."""
        end = self._paused_at if self._paused_at is not None else self._time()
        return end - self._start - self._paused_total

    def pause(self) -> None:
        """Stop the clock (idempotent); entered deadlines stop counting down."""
        if self._paused_at is not None:
            return
        self._paused_at = self._time()
        for deadline in self._deadlines:
            if not deadline.timeout.expired():
                deadline.timeout.reschedule(None)

    def resume(self) -> None:
        """Restart the clock (idempotent); entered deadlines count down what they had left."""
        if self._paused_at is None:
            return
        self._paused_total += self._time() - self._paused_at
        self._paused_at = None
        for deadline in self._deadlines:
            self._arm(deadline)

    def _arm(self, deadline: _Deadline) -> None:
        """Schedule ``deadline``'s timeout on the loop clock for the active time it has left."""
        if deadline.timeout.expired():
            return
        left = max(0.0, deadline.expires_at - self.now())
        deadline.timeout.reschedule(asyncio.get_running_loop().time() + left)

    @contextlib.asynccontextmanager
    async def deadline(self, seconds: float | None) -> AsyncIterator[None]:
        """Like ``asyncio.timeout(seconds)``, but only active seconds count; ``None`` never expires."""
        async with asyncio.timeout(None) as timeout:
            if seconds is None:
                yield
                return
            entry = _Deadline(timeout, self.now() + float(seconds))
            self._deadlines.add(entry)
            try:
                if self.running:
                    self._arm(entry)
                yield
            finally:
                self._deadlines.discard(entry)

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        """Like ``asyncio.wait_for(awaitable, timeout)``, but only active seconds count against ``timeout``."""
        async with self.deadline(timeout):
            return await awaitable
