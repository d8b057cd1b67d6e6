"""Where a SingleController runs for the trainer: its train-side API written once, over a transport.

:class:`ControllerHandle` holds the blocking train-side calls (select, refit, stats, snapshot, ...); each becomes
one :meth:`ControllerHandle._invoke` of a controller method by name, and a home implements only that transport and
``shutdown``. The product's home is :class:`LocalController`: the controller on a private event loop in a daemon
thread of the trainer's process. (A Ray-actor home, measured in ``benchmarks/controller_overhead.py``, lives with
that benchmark: a multi-rank trainer selects on rank 0 and shares the selection over its own process group, so no
rank needs a controller reachable over Ray.)

Every blocking call has a deadline: one that outlives it raises :class:`ControllerUnresponsive` naming the call
(the errors and the :class:`ControllerClient` protocol a handle implements are in ``api.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from sc_lightning.controller.api import (
    ControllerStats,
    ControllerUnresponsive,
    GroupMeta,
    RefitReport,
    ValidationResult,
)
from sc_lightning.controller.controller import SingleController

T = TypeVar("T")
ControllerFactory = Callable[[], SingleController]
BeforeStart = Callable[[SingleController], Awaitable[None]]
"""Runs on the controller's loop after it is built and before its pump starts (e.g. restoring a checkpoint)."""
DEFAULT_CALL_TIMEOUT_S = 600.0
SELECT_GRACE_S = 30.0
"""How much longer than its own ``timeout_s`` a select may take to answer: the controller's SelectTimeout comes
first."""
SIGNAL_CHECK_S = 0.1
"""How often a blocking call wakes to let its thread run Python's signal handlers. The kernel may deliver a signal
sent to the process to any of its threads; Python then runs the handler in the main thread only once that thread
runs Python code again, so a wait on one lock would hold a stop signal until the call returned (a select waiting
for rollouts that hang: minutes, not the seconds a SIGTERM may take)."""

TRAIN_SIDE_METHODS = frozenset(
    {
        "evict",
        "select",
        "refit",
        "begin_refit",
        "push_weights",
        "stand_down_engine",
        "wake_engine",
        "finish_refit",
        "stats",
        "snapshot",
        "validate",
        "validation_results",
        "settle_validation",
        "interrupt_waits",
    }
)
"""The controller methods a handle may invoke by name."""


async def invoke(controller: SingleController, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Call the train-side ``method`` of ``controller`` (a coroutine or a plain method) and return its result."""
    if method not in TRAIN_SIDE_METHODS:
        raise AttributeError(f"{method!r} is not a train-side method of the controller: {sorted(TRAIN_SIDE_METHODS)}")
    result = getattr(controller, method)(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


async def build_and_start(build: ControllerFactory, before_start: BeforeStart | None = None) -> SingleController:
    """Build the controller in its home, run ``before_start`` on it, then start its pump."""
    controller = build()
    if before_start is not None:
        await before_start(controller)
    await controller.start()
    return controller


class ControllerHandle:
    """The blocking train-side API of a running controller; a subclass supplies the transport."""

    refit_deadline_s: float | None = None
    """The deadline of a call that may drain in-flight rollouts (begin_refit, refit, stand_down_engine) under the
    drain gate: past the controller's own ``drain_timeout_s``, so its DrainTimeout comes first (None: the home's
    default)."""
    push_deadline_s: float | None = None
    """The deadline of a call that loads weights into the engine (push_weights): past the engine's own
    ``refit_timeout_s``, so its EngineError comes first (None: the home's default; inf with no refit deadline)."""

    def _invoke(self, method: str, *args: Any, deadline_s: float | None = None, **kwargs: Any) -> Any:
        """Run the controller's ``method`` in its home and wait for the answer (``deadline_s``: the home's
        default)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Stop the controller and release its home."""
        raise NotImplementedError

    def evict(self, trainer_version: int) -> list[GroupMeta]:
        """Drop groups that can never be trained at ``trainer_version``."""
        return self._invoke("evict", trainer_version)

    def select(
        self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None
    ) -> list[GroupMeta] | None:
        """Wait for and take trainable groups; None once rollouts are exhausted."""
        deadline = None if timeout_s is None else timeout_s + SELECT_GRACE_S
        return self._invoke("select", trainer_version, min_groups, max_groups, timeout_s=timeout_s, deadline_s=deadline)

    def refit(
        self, version: int, named_tensors: list[tuple[str, torch.Tensor]] | None, *, wake: bool = False
    ) -> RefitReport:
        """One whole refit in one call: begin, push (None: the policy is unchanged), wake, finish."""
        parts = (self.refit_deadline_s, self.push_deadline_s)  # the drain, then the push: each has its own deadline
        deadline = sum(part for part in parts if part is not None) or None
        return self._invoke("refit", version, named_tensors, wake=wake, deadline_s=deadline)

    def begin_refit(self, next_version: int) -> int:
        """Close dispatch, abort doomed rollouts and (drain gate) wait for the rest to finish."""
        return self._invoke("begin_refit", next_version, deadline_s=self.refit_deadline_s)

    def push_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int, *, last: bool = True) -> None:
        """Load new weights into the generation engine (``last=False``: one bucket of them, more follow)."""
        self._invoke("push_weights", named_tensors, version, last=last, deadline_s=self.push_deadline_s)

    def stand_down_engine(self) -> None:
        """Release a colocated engine's accelerator for the train step."""
        self._invoke("stand_down_engine", deadline_s=self.refit_deadline_s)

    def wake_engine(self) -> None:
        """Take the accelerator back for a colocated engine."""
        self._invoke("wake_engine")

    def finish_refit(self, version: int) -> None:
        """Stamp the new version and reopen dispatch."""
        self._invoke("finish_refit", version)

    def stats(self) -> ControllerStats:
        """Counters of the controller."""
        return self._invoke("stats")

    def snapshot(self, directory: str | None) -> dict[str, Any]:
        """Between steps: the data plane's rows into ``directory``; returns the controller's checkpoint state."""
        return self._invoke("snapshot", directory)

    def validate(self, step: int) -> None:
        """Start validating ``step`` at the version the engine holds now (it runs beside the rollouts)."""
        self._invoke("validate", step, deadline_s=self.refit_deadline_s)

    def validation_results(self) -> list[ValidationResult]:
        """The validations finished since the last call."""
        return self._invoke("validation_results")

    def settle_validation(self) -> list[ValidationResult]:
        """Wait for the validation in flight; every validation finished since the last call."""
        return self._invoke("settle_validation", deadline_s=self.refit_deadline_s)


class LocalController(ControllerHandle):
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
        self.controller: SingleController = self.call(build_and_start(build, before_start))
        validator = self.controller.validator
        waits = [self.controller.settings.drain_timeout_s, None if validator is None else validator.settings.timeout_s]
        waits = [wait for wait in waits if wait is not None]  # a refit may settle a validation, then drain
        self.refit_deadline_s = sum(waits) + call_timeout_s if waits else None
        refit_s = self.controller.manager.settings.refit_timeout_s  # an engine's deadline on one version's weights
        self.push_deadline_s = math.inf if refit_s is None else refit_s + call_timeout_s

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None, *, name: str | None = None) -> T:
        """Run a coroutine on the controller's event loop (e.g. a call on its engine) and return its result.

        ControllerUnresponsive, naming ``name`` (default: the coroutine's), if it does not finish within ``timeout_s``
        (default ``call_timeout_s``).
        """
        limit = timeout_s if timeout_s is not None else self.call_timeout_s
        name = name or getattr(coroutine, "__qualname__", "a call")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        deadline = time.monotonic() + limit
        while True:
            try:  # in slices: between two, this thread runs the signal handlers due (SIGNAL_CHECK_S)
                return future.result(timeout=max(0.0, min(SIGNAL_CHECK_S, deadline - time.monotonic())))
            except TimeoutError:
                if future.done():  # the call itself raised a TimeoutError (e.g. SelectTimeout): that is its answer
                    raise
                if time.monotonic() >= deadline:
                    break
        future.cancel()
        raise ControllerUnresponsive(f"SingleController.{name}", limit)

    def _invoke(self, method: str, *args: Any, deadline_s: float | None = None, **kwargs: Any) -> Any:
        """Run the controller's ``method`` on its loop; ControllerUnresponsive past the deadline, naming the call with
        its numbers (the step or weight version first)."""
        numbers = ", ".join(str(arg) for arg in args if isinstance(arg, int) and not isinstance(arg, bool))
        return self.call(invoke(self.controller, method, args, kwargs), deadline_s, name=f"{method}({numbers})")

    def interrupt_waits(self) -> None:
        """End the trainer's waits for rollouts (a stop signal; see ``SingleController.interrupt_waits``), without
        waiting for the controller: safe from a signal handler while the trainer itself waits on it."""
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(invoke(self.controller, "interrupt_waits", (), {}), self._loop)

    def shutdown(self) -> None:
        """Stop the pump, then the loop and its thread."""
        if not self._loop.is_running():
            return
        self.call(self.controller.shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=self.call_timeout_s)
        self._loop.close()
