"""Environment calls on daemon threads: the result or the exception comes back, a deadline abandons a hung call, and
the hung call's thread never holds the process's exit."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from sc_lightning.rollout.envs.daemon_call import daemon_call


def test_the_result_and_the_exception_come_back_from_a_daemon_thread() -> None:
    seen: list[bool] = []

    def work(x: int) -> int:
        seen.append(threading.current_thread().daemon)
        return x + 1

    def fail() -> None:
        raise ValueError("bad reward")

    assert asyncio.run(daemon_call(work, 1)) == 2 and seen == [True]
    with pytest.raises(ValueError, match="bad reward"):
        asyncio.run(daemon_call(fail))


def test_a_deadline_abandons_a_hung_call_and_the_process_exits_without_waiting_for_it() -> None:
    """In a fresh interpreter: a score that blocks for 60 s, awaited under a 0.2 s deadline; the interpreter then
    exits at once (a default-executor thread would hold its exit for the whole minute)."""
    script = textwrap.dedent(
        """
        import asyncio, time
        from sc_lightning.rollout.envs.daemon_call import daemon_call
        async def main():
            try:
                await asyncio.wait_for(daemon_call(time.sleep, 60), 0.2)
            except TimeoutError:
                print("abandoned", flush=True)
        asyncio.run(main())
        """
    )
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert result.returncode == 0 and result.stdout == "abandoned\n", result.stderr[-2000:]
    assert time.monotonic() - started < 30
