"""The driver side of an engine that lives in a Ray actor: batched requests, attributable errors, refits, shutdown.

:class:`ActorEngineClient` holds what :class:`~sc_lightning.engines.megatron.ray_engine.RayMegatronEngine` and
:class:`~sc_lightning.engines.vllm.VLLMEngine` share: the actor handle, the weight version as of the last refit,
``generate`` / ``update_weights`` / ``stats`` / ``ready`` forwarded to the actor (whose body implements them), Ray
failures turned into :class:`~sc_lightning.engines.base.EngineError` naming the engine and the call, and a
``shutdown`` that stops the engine in the actor and then kills the actor. Subclasses start the actor.

Requests travel in batches: the ``generate`` calls made in one turn of the client's event loop (a prompt group's
completions, a burst of dispatched groups) go to the actor in one streaming call, ``generate_batch`` of
:class:`BatchedGenerateActor`, which hands the outcomes back as they end, those of one engine step together (a Ray
call or streamed item costs milliseconds of CPU on both sides, more than a tiny model's whole decode step). A caller
that stops waiting (a timeout, an abort) has its request cancelled in the actor with ``cancel``, its batch-mates
unaffected; each caller's error names its own request.

Every call has a deadline: requests and refits carry their callers' (``generation_timeout_s``,
``refit_timeout_s``); startup, ``stats`` and ``shutdown`` have the client's own (``startup_timeout_s``,
``control_timeout_s``): a hung actor is an EngineError, and a shutdown that gets no answer kills the actor anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import numpy as np

from sc_lightning.engines.base import EngineError
from sc_lightning.types import Generation, SamplingParams


class ActorEngineClient:
    """A :class:`GenerationEngine` forwarding to a Ray actor (``_actor``, a :class:`BatchedGenerateActor`)."""

    name: str
    _actor: Any
    startup_timeout_s: float = 1800.0  # building the model in the actor (a large model on a GPU takes minutes)
    control_timeout_s: float = 60.0  # stats and shutdown

    def __init__(self, name: str, actor: Any, weight_version: int = 0) -> None:
        self.name, self._actor, self._version = name, actor, weight_version
        self._requests = 0
        self._queued: list[tuple[int, tuple, asyncio.Future[Generation]]] = []  # sent at the loop's next turn
        self._cancels: set[asyncio.Future] = set()  # cancel calls in flight (held so they are not collected)

    @property
    def weight_version(self) -> int:
        """Version of the weights loaded in the actor (as of the last ``update_weights``)."""
        return self._version

    @property
    def actor(self) -> Any:
        """The Ray actor handle (None after ``shutdown``)."""
        return self._actor

    async def _call(self, what: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Await ``method`` of the actor (within ``timeout_s``, None: the caller's deadline holds); Ray failures and
        an expired deadline become EngineError naming the engine and ``what``."""
        if self._actor is None:
            raise self._shut_down(what)
        with self._ray_errors(what):
            try:
                return await asyncio.wait_for(getattr(self._actor, method).remote(*args), timeout_s)
            except TimeoutError:
                raise EngineError(f"engine {self.name!r}, {what}: no answer within {timeout_s} s") from None

    def _shut_down(self, what: str) -> EngineError:
        """The error of a call (``what``) made after :meth:`shutdown`."""
        return EngineError(f"engine {self.name!r}, {what}: the engine is shut down")

    @contextlib.contextmanager
    def _ray_errors(self, what: str) -> Iterator[None]:
        """Ray's failures of a call to the actor, as EngineError naming the engine and ``what``."""
        import ray

        try:
            yield
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as err:
            raise self._engine_error(what, err) from err

    def _engine_error(self, what: str, err: Exception) -> EngineError:
        """``err``, a Ray failure of a call to the actor, as an EngineError naming the engine and ``what``; an
        EngineError raised by the engine keeps its message, which already names both."""
        import ray

        if isinstance(err, ray.exceptions.RayActorError):
            return EngineError(f"engine {self.name!r}, {what}: the engine actor died: {err}")
        cause = getattr(err, "cause", None)
        if isinstance(cause, EngineError):
            return EngineError(str(cause))
        return EngineError(f"engine {self.name!r}, {what}: {cause or err}")

    async def ready(self) -> None:
        """Wait until the actor has built its engine."""
        await self._call("startup", "ready", timeout_s=self.startup_timeout_s)

    async def generate(
        self,
        prompt_token_ids: tuple[int, ...],
        sampling: SamplingParams,
        *,
        stop_token_ids: Iterable[int] = (),
        images: torch.Tensor | None = None,
    ) -> Generation:
        """Sample one completion in the actor: queued, and sent with the other requests of this loop turn.
        ``images``: the prompt's images, uint8 ``(N, H, W, 3)`` on the CPU (a vision-language policy's prompt)."""
        if self._actor is None:
            raise self._shut_down(f"client request {self._requests + 1}")
        self._requests += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        if not self._queued:
            loop.call_soon(self._send_queued)
        request = (tuple(prompt_token_ids), sampling, tuple(stop_token_ids), images)
        self._queued.append((self._requests, request, future))
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
                future.set_exception(self._shut_down(f"client request {rid}"))
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

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Ship HF-named tensors to the actor by value (one ``ray.put``) and load them there as ``version``."""
        self._version = await self._call(
            f"refit to version {version}", "update_weights", ship_by_value(named_tensors), version
        )

    async def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Ship one bucket of ``version``'s HF-named tensors to the actor (more follow); the version stays."""
        await self._call(
            f"refit to version {version} (a bucket)", "stage_weights", ship_by_value(named_tensors), version
        )

    async def stats(self) -> dict[str, float]:
        """The actor engine's counters, read once the cancels this client sent have reached the actor (so a
        request its caller stopped waiting for is not counted as served after the caller moved on)."""
        if self._cancels:
            await asyncio.gather(*self._cancels)
        return await self._call("stats", "stats", timeout_s=self.control_timeout_s)

    async def shutdown(self) -> None:
        """Stop the engine in the actor, then kill the actor; idempotent."""
        import ray

        actor, self._actor = self._actor, None
        if actor is None:
            return
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):  # dead or hung: killed below anyway
            await asyncio.wait_for(actor.shutdown.remote(), self.control_timeout_s)
        ray.kill(actor, no_restart=True)


ShippedWeights = list[tuple[str, "np.ndarray", str]]
"""What an actor's refit method receives: ``(name, array, torch dtype name)`` per tensor (:func:`received_weights`)."""


def ship_by_value(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Any:
    """The tensors as one object in Ray's store, on the CPU, as numpy arrays (what an actor's refit method receives).

    Ray stores numpy arrays as out-of-band buffers and the actor maps them without a copy, where torch tensors go
    through torch's pickler: a refit of the tiny model's 32 tensors took 29 ms that way and 10 ms this way on the
    2-core box. Dtypes numpy lacks (bf16) travel as integers of their width.
    """
    import ray

    shipped: ShippedWeights = []
    for name, tensor in named_tensors:
        cpu = tensor.detach().to("cpu", copy=True).contiguous()
        bits = cpu if cpu.dtype in _NUMPY_DTYPES else cpu.view(_SAME_WIDTH_INT[cpu.element_size()])
        shipped.append((name, bits.numpy(), str(cpu.dtype).removeprefix("torch.")))
    return ray.put(shipped)


def received_weights(shipped: ShippedWeights) -> list[tuple[str, torch.Tensor]]:
    """The tensors :func:`ship_by_value` shipped, in the actor: CPU tensors that are read-only views of Ray's store.

    The engines only read them (convert, copy into their parameters, write a file).
    """
    with warnings.catch_warnings():  # torch warns once that it cannot write to a read-only array: nothing does
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return [(name, torch.from_numpy(array).view(getattr(torch, dtype))) for name, array, dtype in shipped]


_NUMPY_DTYPES = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8}
_NUMPY_DTYPES |= {torch.uint8, torch.bool}
_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class BatchedGenerateActor:
    """The actor side of the client's batched requests: ``generate_batch`` streams the outcomes of many ``generate``
    calls of the actor (which a subclass defines), and ``cancel`` stops some of them."""

    def __init__(self) -> None:
        self._running: dict[int, asyncio.Task] = {}  # generate_batch's requests by client id, until they end

    async def generate(
        self,
        prompt_token_ids: tuple[int, ...],
        sampling: SamplingParams,
        stop_token_ids: tuple[int, ...],
        images: torch.Tensor | None = None,
    ) -> Generation:
        """Sample one completion (the subclass's engine); ``images``: the prompt's, or None (a text prompt)."""
        raise NotImplementedError

    async def generate_batch(
        self, requests: list[tuple[int, tuple[int, ...], SamplingParams, tuple[int, ...], torch.Tensor | None]]
    ) -> AsyncIterator[list[tuple[int, Generation | BaseException | None]]]:
        """:meth:`generate` of each ``(client id, prompt, sampling, stop tokens, images)``, all at once (a Ray
        streaming call); yields the ``(position in requests, outcome)`` of the requests that ended since the last
        yield (those of one engine step come together): the Generation, the exception it raised, or None when
        :meth:`cancel` cancelled it."""
        loop = asyncio.get_running_loop()
        tasks: dict[asyncio.Task, int] = {}
        for index, (rid, prompt, sampling, stops, images) in enumerate(requests):
            task = loop.create_task(self.generate(prompt, sampling, stops, images))
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
