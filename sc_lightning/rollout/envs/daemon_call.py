"""Environment calls off the event loop, on daemon threads: a hung environment never holds the process's exit.

An environment's ``score``, ``start`` and ``step`` are user code that may block (a remote verifier, a sandbox). The
rollout side awaits them under deadlines (``env_timeout_s``), but a thread of Python's default executor that is
still inside a hung call is joined when the interpreter exits, so a stopped fit would wait for it. Each call here
runs on a thread of its own, marked daemon: when the fit has ended, the process exits whatever the call is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def daemon_call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a daemon thread, awaited; its exception is raised here. Cancelling the await abandons the
    call (its thread runs on to the call's end, and its result is dropped)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], object]) -> None:
        """Hand ``outcome`` (setting the await's result or exception) to the awaiting loop."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody awaits the call any more
            loop.call_soon_threadsafe(outcome)

    def run() -> None:
        """The daemon thread: the call, then its outcome to the loop."""
        try:
            result = fn(*args)
        except BaseException as err:  # handed to the awaiting coroutine, whatever it is
            failure = err
            settle(lambda: done.cancelled() or done.set_exception(failure))
        else:
            settle(lambda: done.cancelled() or done.set_result(result))

    threading.Thread(target=run, name=f"sc-env-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await done
