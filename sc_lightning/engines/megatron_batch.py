"""One static decode batch of :class:`~sc_lightning.engines.megatron.MegatronEngine` on megatron's KV cache.

Runs on the engine's worker thread only (synchronous torch). A batch holds requests of any prefix lengths (prompt
plus the tokens they already have, so paused requests resume from where they stopped) and decodes them exactly,
without any padding:

1. **Prefill** the first ``L0 = min(prefix lengths)`` tokens of every row in one call on a fresh
   ``StaticInferenceContext`` (causal attention, RoPE positions from 0 — the same positions the trainer uses).
2. **Decode** one position per call for all rows at once. A row whose prefix is longer than the current position
   is *teacher-forced*: its next prefix token is fed instead of a sample (no logprob); a row past its prefix samples.
   Every row is always a contiguous prefix in the cache, so attention never sees a padding slot and the logits equal
   a full forward pass of the same tokens.
3. Rows that finish (stop token, ``max_new_tokens``, context end) or whose caller went away leave the batch, and the
   cache is compacted to the remaining rows.

The KV buffers are allocated here, on the model's device, before the first call (megatron's own allocator uses
``torch.cuda.current_device()``, which does not exist on CPU), sized to this batch: rows x the longest total length
any row may reach. Dropping the batch frees them. :func:`replier` hands results from this thread to the caller's
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from megatron.core.inference.contexts.static_context import StaticInferenceContext
from megatron.core.transformer.attention import Attention
from torch import Tensor

from sc_lightning.engines.sampling import sample_tokens
from sc_lightning.types import FinishReason, Generation, SamplingParams

Outcome = Generation | BaseException


@dataclass(eq=False)
class Request:
    """One ``generate`` call as the worker thread sees it: the prompt, what was sampled so far, how to reply."""

    rid: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    reply: Callable[[Outcome], None]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    start_version: int | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)

    @property
    def prefix(self) -> tuple[int, ...]:
        """The tokens the model must have seen before the next sample: the prompt, then what was sampled."""
        return self.prompt + tuple(self.tokens)

    @property
    def length(self) -> int:
        """``len(self.prefix)``, without building it."""
        return len(self.prompt) + len(self.tokens)

    def token_at(self, position: int) -> int:
        """The prefix token at ``position`` (``< self.length``)."""
        n = len(self.prompt)
        return self.prompt[position] if position < n else self.tokens[position - n]

    def total_limit(self, max_seq_len: int) -> int:
        """The longest this sequence may grow (prompt + completion), capped by the context."""
        return min(len(self.prompt) + self.sampling.max_new_tokens, max_seq_len)

    def result(self, reason: FinishReason, version: int) -> Generation:
        """The :class:`Generation` of what was sampled so far, ended for ``reason``."""
        start = self.start_version if self.start_version is not None else version
        return Generation(tuple(self.tokens), tuple(self.logprobs), reason, start)


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


def attention_layers(model: torch.nn.Module) -> list[Attention]:
    """The megatron attention modules of ``model`` (one per layer), which own the KV cache slots."""
    return [module for module in model.modules() if isinstance(module, Attention)]


class DecodeBatch:
    """A static batch decoding on its own KV cache: ``prefill()`` once, then ``step()`` until no row is left."""

    def __init__(
        self,
        model: torch.nn.Module,
        layers: Sequence[Attention],
        requests: Sequence[Request],
        *,
        vocab_size: int,
        max_seq_len: int,
    ) -> None:
        self.model = model
        self.rows = list(requests)
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.pos = min(r.length for r in self.rows)  # the position the current logits predict
        length = max(r.total_limit(max_seq_len) for r in self.rows)
        self.context = StaticInferenceContext(len(self.rows), length)
        param = next(model.parameters())
        for layer in layers:
            groups = layer.num_query_groups_per_partition
            shape_k = (length, len(self.rows), groups, layer.key_hidden_size)
            shape_v = (length, len(self.rows), groups, layer.val_hidden_size)
            self.context.key_value_memory_dict[layer.layer_number] = (
                torch.empty(shape_k, dtype=param.dtype, device=param.device),
                torch.empty(shape_v, dtype=param.dtype, device=param.device),
            )
        self.device = param.device
        self.logits: Tensor | None = None
        self.forward_calls = 0
        self.sampled_tokens = 0

    def _forward(self, ids: list[list[int]]) -> None:
        """Run the model on ``ids`` ``(B, S)`` at the context's offset; keep the last position's real-vocab logits."""
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
        out = self.model(tokens, None, None, inference_context=self.context, runtime_gather_output=True)
        self.logits = out[:, -1, : self.vocab_size].float()
        self.context.increment_sequence_len_offset(tokens.size(1))
        self.forward_calls += 1

    def prefill(self) -> None:
        """Encode the first ``pos`` tokens of every row (the shortest prefix) in one call."""
        self._forward([list(r.prefix[: self.pos]) for r in self.rows])
        self.context.enable_decode_mode()

    def _sample(self, rows: list[int]) -> tuple[list[int], list[float]]:
        """Sample the next token of each batch row in ``rows`` with its request's settings."""
        assert self.logits is not None
        params = [self.rows[i].sampling for i in rows]
        tokens, logprobs = sample_tokens(
            self.logits[rows],
            torch.tensor([p.temperature for p in params]),
            torch.tensor([p.top_k or 0 for p in params]),
            torch.tensor([p.top_p for p in params]),
            [self.rows[i].generator for i in rows],
        )
        return tokens.tolist(), logprobs.tolist()

    def _finish_reason(self, request: Request) -> FinishReason | None:
        """Why ``request`` is done after its latest token, or None while it goes on."""
        if request.tokens[-1] in request.stop_ids:
            return "stop"
        if len(request.prompt) + len(request.tokens) >= request.total_limit(self.max_seq_len):
            return "length"
        return None

    def _compact(self, keep: list[int]) -> None:
        """Shrink the KV cache to the batch rows ``keep`` (in that order)."""
        index = torch.tensor(keep, device=self.device)
        memory = self.context.key_value_memory_dict
        for layer, (key, value) in memory.items():
            memory[layer] = (key[:, index], value[:, index])

    def step(self, version: int) -> list[tuple[Request, FinishReason]]:
        """Choose every row's token at ``pos`` (forced or sampled), drop finished rows, feed the rest one position.

        Returns the requests that finished in this step with their reasons; ``version`` is recorded as the start
        version of requests sampling their first token.
        """
        sampling = [i for i, r in enumerate(self.rows) if r.length == self.pos]
        chosen = {i: r.token_at(self.pos) for i, r in enumerate(self.rows) if r.length > self.pos}
        finished: list[tuple[Request, FinishReason]] = []
        if sampling:
            tokens, logprobs = self._sample(sampling)
            self.sampled_tokens += len(tokens)
            for i, token, logprob in zip(sampling, tokens, logprobs, strict=True):
                request = self.rows[i]
                if request.start_version is None:
                    request.start_version = version
                request.tokens.append(token)
                request.logprobs.append(logprob)
                chosen[i] = token
                reason = self._finish_reason(request)
                if reason is not None:
                    finished.append((request, reason))
        done = {id(r) for r, _ in finished}
        keep = [i for i, r in enumerate(self.rows) if id(r) not in done and not r.cancelled.is_set()]
        if len(keep) < len(self.rows) and keep:
            self._compact(keep)
        self.rows = [self.rows[i] for i in keep]
        if self.rows:
            self._forward([[chosen[i]] for i in keep])
            self.pos += 1
        return finished
