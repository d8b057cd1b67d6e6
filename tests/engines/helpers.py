"""Helpers of the engine tests: reference computations (full forward passes without a KV cache), a gate holding the
engine's worker thread where a test sends something mid-generation, and a continuous batch a test steps by hand."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

import torch

from sc_lightning.engines.megatron.batch import ContinuousBatch
from sc_lightning.engines.megatron.cached_forward import CachedForward
from sc_lightning.engines.megatron.kv_rows import KVLayout
from sc_lightning.engines.megatron.request import Request
from sc_lightning.types import SamplingParams

T = TypeVar("T")
HOLD_S = 120.0  # the longest a WorkerGate waits for the worker, or holds it
GREEDY = SamplingParams(12, temperature=0.0)  # a hand-driven batch's default request: 12 greedy tokens


def full_logits(model: torch.nn.Module, ids: tuple[int, ...]) -> torch.Tensor:
    """``(T, vocab)`` fp32 logits of one sequence from a plain full forward pass."""
    from sc_lightning.models import logits_of

    with torch.no_grad():
        return logits_of(model, torch.tensor([ids]))[0]


def greedy_reference(model: torch.nn.Module, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The greedy continuation of ``prompt`` by repeated full forward passes (no KV cache), ``n`` tokens."""
    ids = tuple(prompt)
    for _ in range(n):
        ids += (int(full_logits(model, ids)[-1].argmax()),)
    return ids[len(prompt) :]


def follows_argmax(model: torch.nn.Module, prompt: tuple[int, ...], tokens: tuple[int, ...]) -> list[bool]:
    """For each completion token: whether it is the argmax of a full forward pass over prompt + completion."""
    logits = full_logits(model, tuple(prompt) + tuple(tokens))
    argmax = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
    return [a == t for a, t in zip(argmax, tokens, strict=True)]


class WorkerGate:
    """Holds a MegatronEngine's worker thread before the first step it starts once ``tokens`` tokens have been
    sampled, so that what a test sends there (a command, a request) lands mid-generation however slow the machine:
    counted in steps, not raced against them."""

    def __init__(self, engine: Any, tokens: int) -> None:
        batch, step = engine._batch, engine._batch.step
        self._held, self._go = threading.Event(), threading.Event()

        def gated(version: int) -> Any:
            """The batch's own step, once the gate has opened (the worker reads ``batch.step`` at every step)."""
            if batch.sampled_tokens >= tokens and not self._go.is_set():
                self._held.set()
                self._go.wait(HOLD_S)
            return step(version)

        batch.step = gated

    async def during(self, call: Awaitable[T]) -> asyncio.Task[T]:
        """Wait until the worker is held, start ``call`` (an engine call sends its command or request before its
        first await), then let the worker go on; returns ``call``'s task."""
        assert await asyncio.to_thread(self._held.wait, HOLD_S), "the engine never sampled the gate's tokens"
        task = asyncio.ensure_future(call)
        await asyncio.sleep(0)  # the task runs up to its first await: what it sends is queued
        self._go.set()
        return task


def request(prompt: tuple[int, ...], sampling: SamplingParams = GREEDY) -> Request:
    """A request for a batch driven by hand (its reply is never called: the test reads the request itself)."""
    return Request(f"req-{prompt[:3]}", prompt, sampling, frozenset(), None, lambda outcome: None)


def batch_on(
    model: torch.nn.Module,
    *,
    max_rows: int = 8,
    prefill_tokens: int = 64,
    buckets: bool,
    overlap: bool = False,
    kv_layout: KVLayout = "slots",
    kv_blocks: int | None = None,
) -> ContinuousBatch:
    """A batch over ``model`` (vocabulary 18, context 256) stepped by the test on this thread."""
    return ContinuousBatch(
        CachedForward(model, 256),
        list(model.parameters()),
        max_rows=max_rows,
        max_seq_len=256,
        vocab_size=18,
        prefill_tokens=prefill_tokens,
        cuda_graphs=False,
        buckets=buckets,
        overlap=overlap,
        kv_layout=kv_layout,
        kv_blocks=kv_blocks,
    )
