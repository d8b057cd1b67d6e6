"""Counting permits that know how many are out, so a leak is visible and a double release is an error."""

from __future__ import annotations

import asyncio


class PermitError(RuntimeError):
    """More permits were released than were acquired."""


class Permits:
    """An asyncio semaphore with accounting: ``held`` permits are out, ``total`` exist."""

    def __init__(self, total: int, name: str) -> None:
        if total < 1:
            raise ValueError(f"{name}: needs at least one permit, got {total}")
        self.total = total
        self.name = name
        self.held = 0
        self._over_budget = 0  # permits taken beyond ``total``; the first releases pay them back
        self._semaphore = asyncio.Semaphore(total)

    async def acquire(self) -> None:
        """Wait for a free permit and take it."""
        await self._semaphore.acquire()
        self.held += 1

    async def take_without_waiting(self, count: int) -> None:
        """Take ``count`` permits now, beyond ``total`` if need be; new acquirers wait until the excess is back.

        A resume uses it for the groups a rollout snapshot caught mid-step (already selected, so over the budget).
        """
        for _ in range(count):
            if self._semaphore.locked():
                self._over_budget += 1
            else:
                await self._semaphore.acquire()  # free: returns at once
            self.held += 1

    def release(self, count: int = 1) -> None:
        """Give back ``count`` permits."""
        if count > self.held:
            raise PermitError(f"{self.name}: releasing {count} permit(s) but only {self.held} are held")
        self.held -= count
        for _ in range(count):
            if self._over_budget:
                self._over_budget -= 1
            else:
                self._semaphore.release()
