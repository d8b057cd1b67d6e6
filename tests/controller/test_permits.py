"""Permits: accounting, double release, and permits taken beyond the budget by a resume."""

from __future__ import annotations

import asyncio

import pytest

from sc_lightning.controller.permits import PermitError, Permits


def test_permits_taken_beyond_the_budget_are_paid_back_before_anyone_acquires() -> None:
    async def scenario() -> None:
        permits = Permits(2, "async_rl.max_buffered_rollouts")
        await permits.take_without_waiting(3)  # one over the budget, without waiting
        assert permits.held == 3
        waiter = asyncio.create_task(permits.acquire())
        permits.release(1)  # pays back the excess: still no free permit
        await asyncio.sleep(0)
        assert not waiter.done()
        permits.release(1)  # now one is free
        await asyncio.wait_for(waiter, 5)
        assert permits.held == 2
        permits.release(2)
        with pytest.raises(PermitError, match="max_buffered_rollouts: releasing 1 permit"):
            permits.release(1)

    asyncio.run(scenario())
