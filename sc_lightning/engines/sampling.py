"""Token sampling for generation engines: temperature, top-k / top-p filtering, seeded draws and token logprobs.

Pure torch, batched, with one set of sampling parameters per row (requests of one batch sample differently).

**Logprob convention.** The logprob reported for a chosen token is ``log_softmax(logits / T)[token]`` over the real
vocabulary: the *temperature-scaled* distribution, *before* top-k / top-p truncation. The trainer reproduces it
exactly with ``token_logprobs(model, ids, temperature=scoring_temperature(T))``. Greedy rows (``T <= 0``) take the
argmax and report the logprob under ``T = 1`` (``scoring_temperature(0.0) == 1.0``); ``top_k == 1`` is greedy too but
keeps its temperature for the logprob. Truncation is deliberately not folded in: the truncated distribution puts
probability 0 on tokens the trainer's full softmax keeps, so importance ratios against it would be undefined.

**Filtering order.** Temperature first, then top-k (exactly ``k`` tokens survive, ties broken by token id), then
top-p on the renormalised top-k survivors: the smallest set of most likely tokens whose mass reaches ``top_p``.

**Draws.** Each sampling row draws from its own ``torch.Generator`` (seeded per request), with the exponential race
``argmax(p / E)``, ``E ~ Exp(1)``, which samples exactly from ``p`` and can never pick a token of probability 0. A
request therefore samples the same tokens whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def scoring_temperature(temperature: float) -> float:
    """The temperature under which an engine's logprobs are reported (and the trainer must score): 1 when greedy."""
    return float(temperature) if temperature > 0 else 1.0


def filter_logits(logits: Tensor, top_k: Tensor | None = None, top_p: Tensor | None = None) -> Tensor:
    """``logits`` ``(B, V)`` with the tokens outside each row's top-k / top-p set replaced by ``-inf``.

    ``top_k`` ``(B,)`` int: keep the ``k`` largest (``k <= 0`` or ``k >= V``: no limit). ``top_p`` ``(B,)`` float in
    ``(0, 1]``: then keep the smallest prefix of the sorted, renormalised survivors whose mass reaches ``top_p``
    (``1``: no limit). Surviving values are unchanged; the most likely token always survives.
    """
    if top_k is None and top_p is None:
        return logits
    vocab = logits.size(-1)
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    keep = sorted_logits > float("-inf")
    keep[:, 0] = True
    if top_k is not None:
        k = top_k.to(device=logits.device, dtype=torch.long)
        k = torch.where(k <= 0, torch.full_like(k, vocab), k)
        keep &= torch.arange(vocab, device=logits.device)[None, :] < k[:, None]
    if top_p is not None:
        p = top_p.to(device=logits.device, dtype=torch.float32)[:, None]
        probs = sorted_logits.float().masked_fill(~keep, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        keep &= (mass_before < p) | (p >= 1.0)
    keep_original = torch.zeros_like(keep).scatter(-1, order, keep)
    return logits.masked_fill(~keep_original, float("-inf"))


def _exponential_noise(probs: Tensor, generators: Sequence[torch.Generator | None]) -> Tensor:
    """``Exp(1)`` noise shaped like ``probs`` ``(B, V)``; row ``i`` is drawn from ``generators[i]``."""
    noise = torch.empty_like(probs)
    for row, generator in enumerate(generators):
        noise[row].exponential_(1.0, generator=generator)
    return noise.clamp_min_(torch.finfo(noise.dtype).tiny)


def sample_tokens(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    generators: Sequence[torch.Generator | None],
) -> tuple[Tensor, Tensor]:
    """Choose one token per row of ``logits`` ``(B, V)`` (real vocabulary only); returns ``(tokens, logprobs)``.

    Per-row parameters ``(B,)``: ``temperature`` (``<= 0``: greedy), ``top_k`` (``0``: off; ``1``: greedy),
    ``top_p`` (``1``: off). ``generators[i]`` drives row ``i``'s draw (``None`` uses torch's default generator; unused
    by greedy rows). ``logprobs`` ``(B,)`` fp32 follow the module's convention: the chosen token under
    ``log_softmax(logits / scoring_temperature(T))``, before any truncation.
    """
    logits = logits.float()
    device = logits.device
    temperature = temperature.to(device=device, dtype=torch.float32)
    top_k = top_k.to(device=device, dtype=torch.long)
    greedy = (temperature <= 0) | (top_k == 1)
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scaled = logits / scale[:, None]
    tokens = scaled.argmax(dim=-1)
    sampling_rows = (~greedy).nonzero().flatten()
    if sampling_rows.numel():
        filtered = filter_logits(scaled[sampling_rows], top_k[sampling_rows], top_p.to(device)[sampling_rows])
        probs = filtered.softmax(dim=-1)
        noise = _exponential_noise(probs, [generators[i] for i in sampling_rows.tolist()])
        tokens[sampling_rows] = (probs / noise).argmax(dim=-1)
    logprobs = scaled.log_softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, logprobs
