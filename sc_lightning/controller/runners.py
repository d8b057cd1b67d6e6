"""Where a SingleController runs: on a background event-loop thread in this process, or in a Ray actor.

Both runners take a zero-argument ``build`` function that constructs the controller *inside* its home (the
thread or the actor), and expose the same blocking train-side API, so the train pump (and the tests) can
swap one for the other. Every blocking call has a deadline, and the trainer side checks the controller is alive:
a call that outlives its deadline raises :class:`ControllerUnresponsive` (its event loop is blocked or its process
is gone), and a call to a Ray actor that died raises :class:`ControllerDied` — each naming the call (both errors and
the :class:`ControllerClient` protocol the runners implement are in ``api.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from sc_lightning.controller.api import ControllerDied, ControllerStats, ControllerUnresponsive, GroupMeta
from sc_lightning.controller.controller import SingleController

T = TypeVar("T")
ControllerFactory = Callable[[], SingleController]
BeforeStart = Callable[[SingleController], Awaitable[None]]
"""Runs on the controller's loop after it is built and before its pump starts (e.g. restoring a checkpoint)."""
DEFAULT_CALL_TIMEOUT_S = 600.0


class LocalController:
    """Runs a SingleController on a private event loop in a daemon thread of this process."""

    def __init__(
        self,
        build: ControllerFactory,
        *,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        before_start: BeforeStart | None = None,
    ) -> None:
        self.call_timeout_s = call_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sc-controller", daemon=True)
        self._thread.start()
        self.controller: SingleController = self.call(_build_and_start(build, before_start))

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run a coroutine on the controller's event loop (e.g. a call on its engine) and return its result.

        ControllerUnresponsive if it does not finish within ``timeout_s`` (default ``call_timeout_s``).
        """
        limit = timeout_s if timeout_s is not None else self.call_timeout_s
        name = getattr(coroutine, "__qualname__", "a call")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout=limit)
        except TimeoutError:
            if future.done():  # the call itself raised a TimeoutError (e.g. SelectTimeout): that is its answer
                raise
            future.cancel()
            raise ControllerUnresponsive(name, limit) from None

    def evict(self, trainer_version: int) -> list[GroupMeta]:
        """Drop groups that can never be trained at ``trainer_version``."""
        return self.call(self.controller.evict(trainer_version))

    def select(
        self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None
    ) -> list[GroupMeta] | None:
        """Wait for and take trainable groups; None once rollouts are exhausted."""
        call = self.controller.select(trainer_version, min_groups, max_groups, timeout_s=timeout_s)
        return self.call(call, None if timeout_s is None else timeout_s + 5)

    def begin_refit(self, next_version: int) -> int:
        """Close dispatch and abort doomed rollouts."""
        return self.call(self.controller.begin_refit(next_version))

    def push_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights into the generation engine."""
        self.call(self.controller.push_weights(named_tensors, version))

    def stand_down_engine(self) -> None:
        """Release a colocated engine's accelerator for the train step."""
        self.call(self.controller.stand_down_engine())

    def wake_engine(self) -> None:
        """Take the accelerator back for a colocated engine."""
        self.call(self.controller.wake_engine())

    def finish_refit(self, version: int) -> None:
        """Stamp the new version and reopen dispatch."""
        self.call(self.controller.finish_refit(version))

    def stats(self) -> ControllerStats:
        """Counters of the controller."""
        return self.call(_stats(self.controller))

    def snapshot(self, directory: str | None) -> dict[str, Any]:
        """Between steps: the data plane's rows into ``directory``; returns the controller's checkpoint state."""
        return self.call(self.controller.snapshot(directory))

    def shutdown(self) -> None:
        """Stop the pump, then the loop and its thread."""
        if not self._loop.is_running():
            return
        self.call(self.controller.shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=self.call_timeout_s)
        self._loop.close()


class RayController:
    """Runs a SingleController inside a CPU-only Ray actor; the handle's calls block with a deadline."""

    def __init__(self, build: ControllerFactory, *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        import ray

        self._ray = ray
        self.call_timeout_s = call_timeout_s
        actor_class = ray.remote(num_cpus=0, num_gpus=0, max_concurrency=64)(SingleControllerActor)
        self.actor = actor_class.remote(build)
        self._call("ready")

    def _call(self, method: str, *args: Any, deadline_s: float | None = None, **kwargs: Any) -> Any:
        """Call the actor's ``method`` and wait for its answer (``deadline_s``, default ``call_timeout_s``)."""
        ref = getattr(self.actor, method).remote(*args, **kwargs)
        call = f"SingleController.{method}"
        limit = deadline_s if deadline_s is not None else self.call_timeout_s
        try:
            return self._ray.get(ref, timeout=limit)
        except self._ray.exceptions.GetTimeoutError:
            raise ControllerUnresponsive(call, limit) from None
        except self._ray.exceptions.RayActorError as died:
            raise ControllerDied(f"the SingleController's Ray actor died; {call} got no answer: {died}") from died

    def evict(self, trainer_version: int) -> list[GroupMeta]:
        """Drop groups that can never be trained at ``trainer_version``."""
        return self._call("evict", trainer_version)

    def select(
        self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None
    ) -> list[GroupMeta] | None:
        """Wait for and take trainable groups; None once rollouts are exhausted."""
        deadline = None if timeout_s is None else timeout_s + 30  # the controller's own SelectTimeout comes first
        return self._call("select", trainer_version, min_groups, max_groups, timeout_s=timeout_s, deadline_s=deadline)

    def begin_refit(self, next_version: int) -> int:
        """Close dispatch and abort doomed rollouts."""
        return self._call("begin_refit", next_version)

    def push_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights into the generation engine (tensors travel by value)."""
        self._call("push_weights", named_tensors, version)

    def stand_down_engine(self) -> None:
        """Release a colocated engine's accelerator for the train step."""
        self._call("stand_down_engine")

    def wake_engine(self) -> None:
        """Take the accelerator back for a colocated engine."""
        self._call("wake_engine")

    def finish_refit(self, version: int) -> None:
        """Stamp the new version and reopen dispatch."""
        self._call("finish_refit", version)

    def stats(self) -> ControllerStats:
        """Counters of the controller."""
        return self._call("stats")

    def snapshot(self, directory: str | None) -> dict[str, Any]:
        """Between steps: the data plane's rows into ``directory`` (a path the actor can write)."""
        return self._call("snapshot", directory)

    def shutdown(self) -> None:
        """Stop the pump and end the actor (in order after its pending calls), so no Ray actor outlives the run."""
        try:
            with contextlib.suppress(ControllerDied):  # dead already, or exited while answering: as asked
                self._call("shutdown", deadline_s=60)
                self._call("__ray_terminate__", deadline_s=60)
        finally:
            self._ray.kill(self.actor)  # a no-op once it has exited; the last resort when it is stuck


class SingleControllerActor:
    """The Ray actor body: builds the controller inside the actor and forwards the async train-side API."""

    def __init__(self, build: ControllerFactory) -> None:
        self._build = build
        self.controller: SingleController | None = None

    async def ready(self) -> bool:
        """Build the controller and start its pump on the actor's event loop."""
        self.controller = await _build_and_start(self._build)
        return True

    async def evict(self, trainer_version: int) -> list[GroupMeta]:
        """See SingleController.evict."""
        return await self._controller.evict(trainer_version)

    async def select(
        self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None
    ) -> list[GroupMeta] | None:
        """See SingleController.select."""
        return await self._controller.select(trainer_version, min_groups, max_groups, timeout_s=timeout_s)

    async def begin_refit(self, next_version: int) -> int:
        """See SingleController.begin_refit."""
        return await self._controller.begin_refit(next_version)

    async def push_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """See SingleController.push_weights."""
        await self._controller.push_weights(named_tensors, version)

    async def stand_down_engine(self) -> None:
        """See SingleController.stand_down_engine."""
        await self._controller.stand_down_engine()

    async def wake_engine(self) -> None:
        """See SingleController.wake_engine."""
        await self._controller.wake_engine()

    async def finish_refit(self, version: int) -> None:
        """See SingleController.finish_refit."""
        await self._controller.finish_refit(version)

    async def stats(self) -> ControllerStats:
        """See SingleController.stats."""
        return self._controller.stats()

    async def snapshot(self, directory: str | None) -> dict[str, Any]:
        """See SingleController.snapshot."""
        return await self._controller.snapshot(directory)

    async def shutdown(self) -> None:
        """See SingleController.shutdown."""
        if self.controller is not None:
            await self.controller.shutdown()

    @property
    def _controller(self) -> SingleController:
        if self.controller is None:
            raise RuntimeError("the controller actor was not started (call ready() first)")
        return self.controller


async def _build_and_start(build: ControllerFactory, before_start: BeforeStart | None = None) -> SingleController:
    controller = build()
    if before_start is not None:
        await before_start(controller)
    await controller.start()
    return controller


async def _stats(controller: SingleController) -> ControllerStats:
    return controller.stats()
