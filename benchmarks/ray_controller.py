"""A Ray-actor home for the SingleController, measured against the product's thread home by controller_overhead.py.

The product runs the controller on a thread of the trainer's process (:class:`LocalController`): a multi-rank
trainer selects on rank 0 and shares the selection over its own process group, so it needs no controller reachable
over Ray. This home stays here as the measured alternative. It differs from the thread home only in the transport:
:class:`RayController` is a :class:`ControllerHandle` whose calls are Ray RPCs to :class:`SingleControllerActor`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from sc_lightning.controller.api import ControllerDied, ControllerUnresponsive
from sc_lightning.controller.runners import (
    DEFAULT_CALL_TIMEOUT_S,
    ControllerFactory,
    ControllerHandle,
    build_and_start,
    invoke,
)


class SingleControllerActor:
    """The Ray actor body: builds the controller inside the actor and runs train-side calls by name."""

    def __init__(self, build: ControllerFactory) -> None:
        self._build = build
        self.controller = None

    async def ready(self) -> bool:
        """Build the controller and start its pump on the actor's event loop."""
        self.controller = await build_and_start(self._build)
        return True

    async def invoke(self, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Run one train-side call (see ``sc_lightning.controller.runners.invoke``)."""
        if self.controller is None:
            raise RuntimeError("the controller actor was not started (call ready() first)")
        return await invoke(self.controller, method, args, kwargs)

    async def shutdown(self) -> None:
        """Stop the controller's pump and engine."""
        if self.controller is not None:
            await self.controller.shutdown()


class RayController(ControllerHandle):
    """Runs a SingleController inside a CPU-only Ray actor; the handle's calls block with a deadline."""

    def __init__(self, build: ControllerFactory, *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        import ray

        self._ray = ray
        self.call_timeout_s = call_timeout_s
        actor_class = ray.remote(num_cpus=0, num_gpus=0, max_concurrency=64)(SingleControllerActor)
        self.actor = actor_class.remote(build)
        self._wait(self.actor.ready.remote(), "ready", None)

    def _invoke(self, method: str, *args: Any, deadline_s: float | None = None, **kwargs: Any) -> Any:
        """One Ray RPC to the actor's ``invoke``."""
        return self._wait(self.actor.invoke.remote(method, args, kwargs), method, deadline_s)

    def _wait(self, ref: Any, method: str, deadline_s: float | None) -> Any:
        """The answer of ``ref``; ControllerUnresponsive past the deadline, ControllerDied if the actor died."""
        call = f"SingleController.{method}"
        limit = deadline_s if deadline_s is not None else self.call_timeout_s
        try:
            return self._ray.get(ref, timeout=limit)
        except self._ray.exceptions.GetTimeoutError:
            raise ControllerUnresponsive(call, limit) from None
        except self._ray.exceptions.RayActorError as died:
            raise ControllerDied(f"the SingleController's Ray actor died; {call} got no answer: {died}") from died

    def shutdown(self) -> None:
        """Stop the pump and end the actor (in order after its pending calls), so no Ray actor outlives the run."""
        try:
            with contextlib.suppress(ControllerDied):  # dead already, or exited while answering: as asked
                self._wait(self.actor.shutdown.remote(), "shutdown", 60)
                self._wait(self.actor.__ray_terminate__.remote(), "__ray_terminate__", 60)
        finally:
            self._ray.kill(self.actor)  # a no-op once it has exited; the last resort when it is stuck
