"""Non-colocated Megatron generation: a :class:`MegatronEngine` in its own Ray actor, behind an asyncio client.

:class:`RayMegatronEngine` implements :class:`~sc_lightning.engines.base.GenerationEngine` from any asyncio loop of
the driver: it starts one actor (``num_cpus`` / ``num_gpus`` of it; CPU-only by default) that builds its own replica
from ``(model_name, precision, seed)`` and serves the same protocol, many requests concurrently (an async actor).
Requests travel in batches: the ``generate`` calls made in one turn of the client's event loop (a prompt group's
completions, a burst of dispatched groups) go to the actor in one streaming call, ``generate_batch``, which hands the
outcomes back as they end, those of one decode step together (a Ray call or streamed item costs milliseconds of CPU
on both sides, more than a tiny model's whole decode step); a caller that stops waiting (a timeout, an abort) has its
request cancelled in the actor with ``cancel``, its batch-mates unaffected. Weights travel by value:
``update_weights`` copies the tensors to CPU and ships them in one ``ray.put``. Errors of the actor come back as
:class:`~sc_lightning.engines.base.EngineError` naming the engine and the request; ``shutdown()`` kills the actor.
Ray must be initialised by the caller (``ray.init``) before the client is built.

The client keeps its own :class:`~sc_lightning.engines.megatron_clock.ActiveClock` (paused by ``stand_down``), so
``active_deadline`` / ``active_wait_for`` work as on the in-process engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import Any, TypeVar

import torch

from sc_lightning.engines.actor_client import ActorEngineClient
from sc_lightning.engines.base import EngineError
from sc_lightning.engines.megatron_clock import ActiveClock
from sc_lightning.types import Generation, SamplingParams

T = TypeVar("T")


# torch.distributed rendezvous variables a worker may inherit from its driver (whose torchrun or lone-process group
# owns that port): the actor is a world of its own, so it drops them and picks a free port.
_INHERITED_DIST_VARS = ("MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class MegatronEngineActor:
    """The Ray actor body: one :class:`MegatronEngine` built in the actor process, its protocol as async methods."""

    def __init__(self, model_name: str, precision: str, seed: int, tokenizer_name: str | None, kwargs: dict) -> None:
        from sc_lightning.engines.megatron import MegatronEngine

        if not torch.distributed.is_initialized():
            for var in _INHERITED_DIST_VARS:
                os.environ.pop(var, None)

        self.engine = MegatronEngine.from_pretrained(
            model_name, precision=precision, seed=seed, tokenizer_name=tokenizer_name, **kwargs
        )
        self._running: dict[int, asyncio.Task] = {}  # generate_batch's requests by client id, until they end

    async def ready(self) -> int:
        """The weight version once the model is built (callers await it to know the actor is up)."""
        return self.engine.weight_version

    async def generate_batch(
        self, requests: list[tuple[int, tuple[int, ...], SamplingParams, tuple[int, ...]]]
    ) -> AsyncIterator[list[tuple[int, Generation | BaseException | None]]]:
        """``MegatronEngine.generate`` of each ``(client id, prompt, sampling, stop tokens)``, all at once (a Ray
        streaming call); yields the ``(position in requests, outcome)`` of the requests that ended since the last
        yield (those of one decode step come together): the Generation, the exception it raised, or None when
        :meth:`cancel` cancelled it."""
        loop = asyncio.get_running_loop()
        tasks: dict[asyncio.Task, int] = {}
        for index, (rid, prompt, sampling, stops) in enumerate(requests):
            task = loop.create_task(self.engine.generate(prompt, sampling, stop_token_ids=stops))
            self._running[rid] = task
            tasks[task] = index
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                yield [(tasks[task], None if task.cancelled() else task.exception() or task.result()) for task in done]
        finally:  # the whole call cancelled (every caller stopped waiting): so are its requests
            for task, index in tasks.items():
                task.cancel()
                self._running.pop(requests[index][0], None)

    async def cancel(self, ids: list[int]) -> None:
        """Cancel the requests of running ``generate_batch`` calls with these client ids (unknown ids: done)."""
        for rid in ids:
            task = self._running.get(rid)
            if task is not None:
                task.cancel()

    async def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> int:
        """``MegatronEngine.update_weights`` in the actor; returns the version now loaded."""
        await self.engine.update_weights(named_tensors, version)
        return self.engine.weight_version

    async def stage_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """``MegatronEngine.stage_weights`` in the actor."""
        await self.engine.stage_weights(named_tensors, version)

    async def stand_down(self) -> None:
        """``MegatronEngine.stand_down`` in the actor."""
        await self.engine.stand_down()

    async def wake(self) -> None:
        """``MegatronEngine.wake`` in the actor."""
        await self.engine.wake()

    async def shutdown(self) -> None:
        """``MegatronEngine.shutdown`` in the actor (the client kills the actor afterwards)."""
        await self.engine.shutdown()

    async def stats(self) -> dict[str, int]:
        """The engine's counters as a dict."""
        return dict(vars(self.engine.stats))


class RayMegatronEngine(ActorEngineClient):
    """A :class:`GenerationEngine` client of a :class:`MegatronEngineActor` (non-colocated placement).

    ``engine_kwargs`` go to :class:`MegatronEngine` in the actor (``max_batch_size``, ``max_seq_len``,
    ``extra_stop_token_ids``, ``stop_on_eos``, ``weight_version``). ``actor_name`` registers the actor under that
    name in Ray (default: none).
    """

    def __init__(
        self,
        model_name: str,
        *,
        precision: str = "fp32",
        seed: int = 0,
        tokenizer_name: str | None = None,
        name: str = "megatron-ray",
        num_cpus: float = 1,
        num_gpus: float = 0,
        actor_name: str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        import ray

        self._clock = ActiveClock()
        engine_kwargs.setdefault("name", name)
        actor_class = ray.remote(MegatronEngineActor)
        options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_concurrency": 10_000}
        if actor_name is not None:
            options["name"] = actor_name
        actor = actor_class.options(**options).remote(model_name, precision, seed, tokenizer_name, engine_kwargs)
        super().__init__(name, actor, int(engine_kwargs.get("weight_version", 0)))
        self._queued: list[tuple[int, tuple, asyncio.Future[Generation]]] = []  # sent at the loop's next turn
        self._cancels: set[asyncio.Future] = set()  # cancel calls in flight (held so they are not collected)

    async def generate(
        self, prompt_token_ids: tuple[int, ...], sampling: SamplingParams, *, stop_token_ids: Iterable[int] = ()
    ) -> Generation:
        """Sample one completion in the actor: queued, and sent with the other requests of this loop turn."""
        if self._actor is None:
            raise EngineError(f"engine {self.name!r}, client request {self._requests + 1}: the engine is shut down")
        self._requests += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        if not self._queued:
            loop.call_soon(self._send_queued)
        self._queued.append((self._requests, (tuple(prompt_token_ids), sampling, tuple(stop_token_ids)), future))
        return await future

    def _send_queued(self) -> None:
        """Send the queued requests as one streaming ``generate_batch`` call (a task that settles their futures)."""
        batch, self._queued = self._queued, []
        call = asyncio.ensure_future(self._stream(batch))
        for rid, _, future in batch:
            future.add_done_callback(lambda f, rid=rid: self._on_caller_done(f, rid, batch, call))

    async def _stream(self, batch: list[tuple[int, tuple, asyncio.Future[Generation]]]) -> None:
        """Run one ``generate_batch`` call, handing each caller its outcome as it comes; the call's own failure goes
        to every caller still waiting, as an EngineError naming the engine and that caller's request."""
        import ray

        if self._actor is None:
            for rid, _, future in batch:
                shut_down = f"engine {self.name!r}, client request {rid}: the engine is shut down"
                future.set_exception(EngineError(shut_down))
            return
        try:
            method = self._actor.generate_batch.options(num_returns="streaming")
            async for ref in method.remote([(rid, *args) for rid, args, _ in batch]):
                for index, outcome in await ref:
                    self._settle(batch[index], outcome)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as failure:
            for rid, _, future in batch:
                if not future.done():
                    future.set_exception(self._engine_error(f"client request {rid}", failure))

    def _settle(self, request: tuple[int, tuple, asyncio.Future[Generation]], outcome: Any) -> None:
        """Hand a waiting caller its request's outcome: the Generation, or the actor's exception as EngineError."""
        rid, _, future = request
        if future.done() or outcome is None:
            return
        if isinstance(outcome, EngineError):
            future.set_exception(EngineError(str(outcome)))
        elif isinstance(outcome, BaseException):
            future.set_exception(EngineError(f"engine {self.name!r}, client request {rid}: {outcome}"))
        else:
            future.set_result(outcome)

    def _on_caller_done(self, future: asyncio.Future, rid: int, batch: list, call: asyncio.Future) -> None:
        """A caller stopped waiting: cancel its request in the actor (the whole call once none is awaited)."""
        if not future.cancelled() or call.done():
            return
        if all(f.cancelled() for _, _, f in batch):
            call.cancel()
        else:
            cancelling = asyncio.ensure_future(self._cancel_quietly([rid]))
            self._cancels.add(cancelling)
            cancelling.add_done_callback(self._cancels.discard)

    async def _cancel_quietly(self, ids: list[int]) -> None:
        """``cancel`` in the actor; a dead actor has no request left to cancel."""
        with contextlib.suppress(EngineError):
            await self._call("cancel", "cancel", ids, timeout_s=self.control_timeout_s)

    def active_deadline(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[None]:
        """``asyncio.timeout(seconds)`` counting only the time the engine is awake (raises ``TimeoutError``)."""
        return self._clock.deadline(seconds)

    async def active_wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        """``asyncio.wait_for(awaitable, timeout)`` counting only the time the engine is awake."""
        return await self._clock.wait_for(awaitable, timeout)

    async def stand_down(self) -> None:
        """Pause the actor's decoding and the client's active clock."""
        self._clock.pause()
        await self._call("stand_down", "stand_down")

    async def wake(self) -> None:
        """Resume the actor's decoding and the client's active clock."""
        await self._call("wake", "wake")
        self._clock.resume()
