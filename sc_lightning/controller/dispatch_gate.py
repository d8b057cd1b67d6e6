"""The dispatch gate: closed while a refit runs; it counts the rollouts it let through that are still generating.

A rollout passes the gate (:meth:`DispatchGate.enter`) just before its task is created, and leaves it once the task
ends, committed or not. The count is what the drain gate (``async_rl.in_flight_weight_updates: false``) waits on:
it includes a task created but not yet started, which the rollout manager's ``inflight`` map cannot see yet.
"""

from __future__ import annotations

import asyncio


class DispatchGate:
    """Open or closed; ``generating`` rollouts passed it and have not finished."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.generating = 0

    def close(self) -> None:
        """No rollout passes until :meth:`open` (those already through keep generating)."""
        self._open.clear()

    def open(self) -> None:
        """Let waiting and new rollouts through."""
        self._open.set()

    async def enter(self) -> None:
        """Wait until the gate is open, then count one rollout generating.

        The gate is checked again after each wake-up: a waiter woken by an ``open`` that a ``close`` followed
        before it ran must not slip into a refit. No await comes between the last check and the count.
        """
        while not self._open.is_set():
            await self._open.wait()
        self.generating += 1
        self._idle.clear()

    def leave(self) -> None:
        """A rollout that passed the gate has finished (committed, failed or cancelled)."""
        if self.generating < 1:
            raise RuntimeError("the dispatch gate was left more often than it was entered")
        self.generating -= 1
        if not self.generating:
            self._idle.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait until nothing that passed the gate is generating; TimeoutError past ``timeout_s``.

        Close the gate first, or new rollouts may keep it busy.
        """
        await asyncio.wait_for(self._idle.wait(), timeout_s)
