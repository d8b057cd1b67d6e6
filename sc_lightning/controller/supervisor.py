"""The controller's background tasks — the rollout pump and those added beside it — and the first one to fail.

A failed task does not stop the others by itself: its failure is kept, the controller's waiters are woken, and the
trainer's next call raises it as :class:`~sc_lightning.controller.api.RolloutPumpError`, naming the task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from sc_lightning.controller.api import RolloutPumpError


class TaskSupervisor:
    """Starts named background tasks, keeps the first failure among them, and cancels them all at shutdown."""

    def __init__(self, notify: Callable[[], Awaitable[None]]) -> None:
        self._notify = notify  # wakes the controller's waiters, so a waiting select sees the failure
        self._tasks: list[asyncio.Task] = []
        self._failure: BaseException | None = None
        self._failed_part = ""

    def start(self, part: str, coroutine: Coroutine[Any, Any, None], *, task_name: str | None = None) -> asyncio.Task:
        """Run ``coroutine`` as a task; ``part`` names it in the failure the trainer sees."""
        task = asyncio.create_task(coroutine, name=task_name or part)
        task.add_done_callback(lambda done: self._on_done(part, done))
        self._tasks.append(task)
        return task

    def _on_done(self, part: str, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure, self._failed_part = task.exception(), part
        asyncio.ensure_future(self._notify())

    def raise_if_failed(self) -> None:
        """Raise the first task failure, naming the task and (for the pump) the prompt and group that failed."""
        if self._failure is None:
            return
        failure = self._failure
        causes = failure.exceptions if isinstance(failure, BaseExceptionGroup) else (failure,)
        details = "; ".join(str(cause) for cause in causes)
        raise RolloutPumpError(f"{self._failed_part} failed: {details}") from causes[0]

    async def cancel(self) -> None:
        """Cancel the tasks still running, the last started first (the pump last), and wait for them to end."""
        running = [task for task in reversed(self._tasks) if not task.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
