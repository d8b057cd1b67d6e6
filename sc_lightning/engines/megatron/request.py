"""A request as the Megatron engine's worker thread sees it, and how its outcome reaches the caller's event loop.

:class:`Request` is one ``generate`` call inside the engine: its prompt and sampling, what it has sampled so far
(tokens, logprobs, each token's weight version), its cancellation flag, and ``reply``, a thread-safe callback
(:func:`replier`) that resolves the caller's future on the caller's loop with the :class:`Generation` or the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from sc_lightning.engines.megatron.decode_sampling import NoiseStream
from sc_lightning.types import FinishReason, Generation, SamplingParams

Outcome = Generation | BaseException


@dataclass(eq=False)
class Request:
    """One ``generate`` call as the worker thread sees it: the prompt, what was sampled so far, how to reply."""

    rid: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    stop_ids: frozenset[int]
    noise: NoiseStream | None  # None when greedy
    reply: Callable[[Outcome], None]
    images: Tensor | None = None  # uint8 (N, H, W, 3): the images of the prompt's <image> runs (a VLM), on the device
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the weight version that sampled each token
    start_version: int | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)

    @property
    def length(self) -> int:
        """Tokens the model must have seen before the next sample: the prompt, then what was sampled."""
        return len(self.prompt) + len(self.tokens)

    @property
    def last_token(self) -> int:
        """The last token of the prefix (the one a decode step feeds)."""
        return self.tokens[-1] if self.tokens else self.prompt[-1]

    def tokens_between(self, start: int, stop: int) -> list[int]:
        """The prefix tokens at positions ``start..stop-1`` (``stop <= self.length``)."""
        n = len(self.prompt)
        return list(self.prompt[start:stop]) + self.tokens[max(0, start - n) : max(0, stop - n)]

    def total_limit(self, max_seq_len: int) -> int:
        """The longest this sequence may grow (prompt + completion), capped by the context."""
        return min(len(self.prompt) + self.sampling.max_new_tokens, max_seq_len)

    def result(self, reason: FinishReason, version: int) -> Generation:
        """The :class:`Generation` of what was sampled so far, ended for ``reason``."""
        start = self.start_version if self.start_version is not None else version
        return Generation(tuple(self.tokens), tuple(self.logprobs), reason, start, tuple(self.versions))


def _settle(future: asyncio.Future, outcome: Any) -> None:
    """Resolve ``future`` with ``outcome`` (an exception is raised to the awaiting coroutine) unless it is done."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def replier(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> Callable[[Any], None]:
    """A thread-safe callback that resolves ``future`` on ``loop`` (silently dropped when the loop is closed)."""

    def reply(outcome: Any) -> None:
        """Schedule ``future``'s resolution with ``outcome`` on ``loop`` (callable from any thread)."""
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, future, outcome)

    return reply
