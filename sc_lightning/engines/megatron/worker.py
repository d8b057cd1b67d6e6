"""The Megatron engine's worker thread: the one owner of the model, its step loop and the control commands.

:class:`DecodeWorker` holds what the engine's event-loop side and its thread share — the pending requests, the
control commands and the condition that guards both — and runs the thread's loop: wait for work, apply the commands
between two steps (each after the step in flight is read), let pending requests join the
:class:`~sc_lightning.engines.megatron.batch.ContinuousBatch` while it has free rows, run one step, reply to the
requests that finished. The event-loop side (:class:`~sc_lightning.engines.megatron.engine.MegatronEngine`) only
enqueues and awaits: every reply comes back through the request's or command's thread-safe ``reply``.

Commands: ``update`` (a full set of weights, HF- or megatron-named, or a refit's last bucket), ``stage`` (one
bucket; decoding holds until the version's last bucket), ``stand_down`` (free the KV cache and graphs, hold
decoding), ``wake`` and ``shutdown`` (every request still held ends with ``finish_reason="abort"``; the thread ends).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import torch

from sc_lightning.engines.base import EngineError
from sc_lightning.engines.megatron.batch import ContinuousBatch
from sc_lightning.engines.megatron.request import Outcome, Request
from sc_lightning.models.convert import hf_to_megatron_state
from sc_lightning.models.megatron import copy_megatron_weights, load_hf_weights, megatron_weights
from sc_lightning.models.spec import ModelSpec
from sc_lightning.types import FinishReason

CommandKind = Literal["update", "stage", "stand_down", "wake", "shutdown"]


@dataclass
class EngineStats:
    """Counters of an engine's work since it started (read them to check batching).

    ``batches`` counts runs of the continuous batch (from no running request to some); ``forward_calls`` is
    ``decode_steps`` + ``prefill_chunks``; every token is sampled by a decode step, so ``generated_tokens`` /
    ``decode_steps`` is the mean rows decoding together, against the ``kv_slots`` rows of the last KV-cache
    allocation (:mod:`sc_lightning.engines.decode_counters`). ``copied_positions`` counts the prompt positions rows
    took by copy from another row of the same prompt instead of prefilling them
    (:mod:`~sc_lightning.engines.megatron.prompt_copies`). ``preemptions`` counts the rows a paged KV cache short
    of blocks sent back to the queue (each prefills its prompt and what it sampled again). ``graph_captures`` counts
    the decode shapes captured as CUDA graphs (again after each stand-down, which frees them) and ``graph_capture_s``
    the host's seconds on them (:mod:`~sc_lightning.engines.megatron.cuda_graphs`); both 0 without graphs.
    """

    batches: int = 0
    forward_calls: int = 0
    decode_steps: int = 0
    prefill_chunks: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    kv_slots: int = 0
    copied_positions: int = 0
    preemptions: int = 0
    graph_captures: int = 0
    graph_capture_s: float = 0.0


@dataclass
class Command:
    """A control request for the worker thread, applied between two decode steps."""

    kind: CommandKind
    reply: Callable[[Outcome | None], None]
    named_tensors: Iterable[tuple[str, torch.Tensor]] | None = None
    version: int = 0


def request_error(engine: str, rid: str, message: str) -> EngineError:
    """An EngineError naming engine ``engine`` and request ``rid``."""
    return EngineError(f"engine {engine!r}, request {rid}: {message}")


class DecodeWorker:
    """The thread that owns ``model`` and runs ``batch``: admits requests, applies commands, replies.

    ``version`` is the version of ``model``'s weights; only the thread changes it (and ``stats``), the event-loop
    side reads them. ``name`` is the engine's, for errors and the thread's name.
    """

    def __init__(self, model: torch.nn.Module, spec: ModelSpec, batch: ContinuousBatch, *, name: str, version: int):
        self.name = name
        self.version = version
        self.stats = EngineStats()
        self._model, self._spec, self._batch = model, spec, batch
        self._device = next(model.parameters()).device
        self._megatron_names = frozenset(name for name, _ in megatron_weights(model))
        self._closed = False
        self._cond = threading.Condition()
        self._pending: deque[Request] = deque()
        self._commands: list[Command] = []
        self._stood_down = False
        self._staged: tuple[int, set[str]] | None = None  # (version, parameters) of stage_weights
        self._thread = threading.Thread(target=self._main, name=f"{name}-decode", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: the worker takes no more requests."""
        return self._closed

    def submit(self, request: Request) -> bool:
        """Queue ``request`` for the batch; False when the worker is closed."""
        with self._cond:
            if self._closed:
                return False
            self._pending.append(request)
            self._cond.notify()
        return True

    def send(self, command: Command) -> bool:
        """Queue ``command`` for the next step boundary; False when the thread has ended."""
        with self._cond:
            if not self._thread.is_alive():
                return False
            self._commands.append(command)
            self._cond.notify()
        return True

    def close(self) -> bool:
        """Take no more requests (a ``shutdown`` command then ends the thread); False when already closed."""
        with self._cond:
            was_open, self._closed = not self._closed, True
        return was_open

    async def join(self) -> None:
        """Wait, off the event loop, for the thread to end."""
        await asyncio.to_thread(self._thread.join)

    # ---- on the thread ---------------------------------------------------------------------------------------

    def _main(self) -> None:
        """The step loop: apply control commands, admit pending requests, run one step; exits on shutdown."""
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        while True:
            commands, joining = self._next_work()
            if commands:
                self._advance(self._batch.drain)  # a decode step still in flight is read before any command
            for command in commands:
                self._apply(command)
                if command.kind == "shutdown":
                    return
            if joining and not self._batch.rows:
                self.stats.batches += 1
            for request in joining:
                self._batch.add(request)
            if not commands:
                self._advance(self._batch.step)
                self._requeue_returned()

    def _next_work(self) -> tuple[list[Command], list[Request]]:
        """Wait for commands (returned alone) or, when awake, work: the pending requests that fit in the batch."""
        with self._cond:
            while not self._commands and (
                self._stood_down or self._staged is not None or not (self._pending or self._batch.rows)
            ):
                self._cond.wait()
            if self._commands:
                commands, self._commands = self._commands, []
                return commands, []
            joining: list[Request] = []
            while self._pending and len(self._batch.rows) + len(joining) < self._batch.capacity:
                request = self._pending.popleft()
                if not request.cancelled.is_set():
                    joining.append(request)
            return [], joining

    def _requeue_returned(self) -> None:
        """Put the rows a smaller KV cache had no slot for back at the head of the queue, in their order."""
        returned, self._batch.returned = self._batch.returned, []
        if returned:
            with self._cond:
                self._pending.extendleft(reversed(returned))

    def _apply(self, command: Command) -> None:
        """Apply one control command and reply to its caller."""
        try:
            if command.kind in ("update", "stage") and (command.kind == "stage" or self._staged is not None):
                self._load_bucket(command)
            elif command.kind == "update":
                assert command.named_tensors is not None
                weights = dict(command.named_tensors)
                if weights and next(iter(weights)) in self._megatron_names:
                    copy_megatron_weights(self._model, weights)
                else:
                    load_hf_weights(self._model, self._spec, weights)
                self.version = command.version
                self._batch.weights_changed()
            elif command.kind == "stand_down":
                self._stood_down = True
                self._release_cache()
            elif command.kind == "wake":
                self._stood_down = False
            else:  # shutdown: the memory goes back now, not when the engine object is collected
                self._abort_all()
                self._release_cache()
        except Exception as err:
            command.reply(EngineError(f"engine {self.name!r}: {command.kind} failed: {type(err).__name__}: {err}"))
        else:
            command.reply(None)

    def _load_bucket(self, command: Command) -> None:
        """Load one bucket of HF-named weights (``stage``), or the last one (``update``: every parameter of the
        model must have come in one of the version's buckets; then the version is adopted and decoding resumes)."""
        assert command.named_tensors is not None
        version, loaded = self._staged or (command.version, set())
        if version != command.version:
            raise ValueError(f"a bucket of version {command.version} while version {version}'s buckets are loading")
        self._staged = (version, loaded)  # decoding holds from the first bucket on
        part = hf_to_megatron_state(dict(command.named_tensors), self._spec, partial=True)  # TP=1, PP=1
        unexpected = self._model.load_state_dict(part, strict=False).unexpected_keys
        if unexpected:
            raise KeyError(f"weights do not fit the model: unexpected {unexpected[:8]}")
        loaded.update(part)
        if command.kind == "update":
            missing = sorted(self._megatron_names - loaded)
            if missing:
                raise KeyError(f"version {version}'s buckets miss {missing[:8]}")
            self._staged, self.version = None, version
            self._batch.weights_changed()

    def _release_cache(self) -> None:
        """Free the KV cache and the CUDA graphs, and hand the freed memory back to the device."""
        self._batch.release()
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    def _abort_all(self) -> None:
        """End every running and pending request with ``finish_reason="abort"`` and what it has so far."""
        with self._cond:
            pending, self._pending = list(self._pending), deque()
        for request in self._batch.clear() + pending:
            request.reply(request.result("abort", self.version))

    def _advance(self, run: Callable[[int], list[tuple[Request, FinishReason]]]) -> None:
        """``run`` the batch one step (or drain it); replies to the requests that finished (all fail on an error)."""
        batch = self._batch
        try:
            with torch.inference_mode():
                finished = run(self.version)
        except Exception as err:
            for request in batch.clear():
                request.reply(request_error(self.name, request.rid, f"decoding failed: {type(err).__name__}: {err}"))
            return
        finally:
            stats = self.stats
            stats.decode_steps, stats.prefill_chunks = batch.decode_steps, batch.prefill_calls
            stats.forward_calls = batch.decode_steps + batch.prefill_calls
            stats.generated_tokens, stats.copied_positions = batch.sampled_tokens, batch.copied_positions
            stats.preemptions = batch.preemptions
            if batch.graphs is not None:
                stats.graph_captures, stats.graph_capture_s = batch.graphs.captures, batch.graphs.capture_s
            if batch.cache is not None:  # freed at a stand-down: the last allocation's rows stand
                stats.kv_slots = batch.cache.slots
        for request, reason in finished:
            self.stats.finished_requests += 1
            request.reply(request.result(reason, self.version))
