"""Sampling for the Megatron engine's decode step: the rules of :mod:`~sc_lightning.engines.sampling`, batched.

:func:`sample_next` follows :func:`~sc_lightning.engines.sampling.sample_tokens`'s conventions (the logprob is the
chosen token's under ``log_softmax(logits / scoring_temperature(T))`` before truncation; temperature, then top-k,
then top-p; greedy rows take the argmax; sampled rows win the exponential race ``argmax(p / E)``, ``E ~ Exp(1)``,
an exact draw that never picks a token of probability 0). Two things make it fit a step that must not stall:

- Row classes (greedy or sampled, filtered or not, all at temperature 1) are read from the settings on the host,
  so nothing waits for the device until the caller reads the result; rows without top-k/top-p skip the filter
  (it would keep every token), a batch at temperature 1 skips the division.
- A request's noise comes from its :class:`NoiseStream`: its own generator draws ``Exp(1)`` noise for many steps
  at once (one kernel every few dozen tokens instead of one per token), and each step takes the next row. A
  request thus samples the same tokens whatever shares its batch, and after a pause; the draws differ from
  ``sample_tokens``' (which draws one row per call).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from sc_lightning.engines.sampling import filter_logits
from sc_lightning.types import SamplingParams

NOISE_ELEMENTS = 1 << 20  # noise values a stream draws at once (4 MiB of fp32), at most 64 steps' worth


def to_device(values: Sequence[Any], dtype: torch.dtype, device: torch.device) -> Tensor:
    """``values`` (numbers or nested lists) as a tensor on ``device``, through pinned memory on a GPU (no sync)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


class NoiseStream:
    """One request's ``Exp(1)`` noise over the vocabulary, one row per sampled token, drawn from its generator."""

    def __init__(self, generator: torch.Generator, vocab_size: int) -> None:
        self.generator = generator
        self.vocab_size = vocab_size
        self.rows_per_draw = max(1, min(64, NOISE_ELEMENTS // vocab_size))
        self._block: Tensor | None = None
        self._next = 0

    def next_row(self) -> Tensor:
        """The noise ``(vocab,)`` of the next sampled token (a new block is drawn when the last one is used up)."""
        if self._block is None or self._next == self._block.size(0):
            block = torch.empty((self.rows_per_draw, self.vocab_size), device=self.generator.device)
            self._block = block.exponential_(1.0, generator=self.generator).clamp_min_(torch.finfo(block.dtype).tiny)
            self._next = 0
        self._next += 1
        return self._block[self._next - 1]


def noise_stream(
    sampling: SamplingParams, seeds: random.Random, device: torch.device, vocab_size: int
) -> NoiseStream | None:
    """A request's noise stream, seeded with ``sampling.seed`` or else drawn from ``seeds`` (None when greedy)."""
    if is_greedy(sampling):
        return None
    seed = sampling.seed if sampling.seed is not None else seeds.getrandbits(63)
    return NoiseStream(torch.Generator(device=device).manual_seed(seed), vocab_size)


def is_greedy(params: SamplingParams) -> bool:
    """Whether a row takes the argmax (``temperature <= 0`` or ``top_k == 1``), as ``sample_tokens`` decides."""
    return params.temperature <= 0 or params.top_k == 1


def sample_next(
    logits: Tensor, params: Sequence[SamplingParams], noise: Sequence[NoiseStream | None]
) -> tuple[Tensor, Tensor]:
    """Choose one token per row of ``logits`` ``(N, V)`` (real vocabulary, fp32); returns ``(tokens, logprobs)``.

    Row ``i`` follows ``params[i]``; a sampled row takes its noise from ``noise[i]`` (None for greedy rows). Both
    results stay on the device.
    """
    device = logits.device
    temperatures = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    scaled = logits
    if any(t != 1.0 for t in temperatures):
        scaled = logits / to_device(temperatures, torch.float32, device)[:, None]
    drawn = [i for i, p in enumerate(params) if not is_greedy(p)]
    tokens = scaled.argmax(dim=-1) if len(drawn) < len(params) else None
    if drawn:
        index = None if tokens is None else to_device(drawn, torch.long, device)
        subset = scaled if index is None else scaled.index_select(0, index)
        chosen = [params[i] for i in drawn]
        if any(p.top_k or p.top_p < 1.0 for p in chosen):
            top_k = to_device([p.top_k or 0 for p in chosen], torch.long, device)
            top_p = to_device([p.top_p for p in chosen], torch.float32, device)
            subset = filter_logits(subset, top_k, top_p)
        rows = [noise[i] for i in drawn]
        assert all(stream is not None for stream in rows), "every sampled row needs a noise stream"
        exponential = torch.stack([stream.next_row() for stream in rows if stream is not None])
        picks = (subset.softmax(dim=-1) / exponential).argmax(dim=-1)
        tokens = picks if tokens is None or index is None else tokens.index_copy(0, index, picks)
    assert tokens is not None
    logprobs = scaled.log_softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, logprobs
