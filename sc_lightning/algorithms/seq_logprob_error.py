"""Sequence-level logprob error: how far the engine's logprobs of each sequence are from the trainer's.

Shape legend: ``B`` rows (sequences) of a micro-batch, ``T`` tokens per row, aligned with ``input_ids`` as in
:mod:`.losses`. For row ``b`` with valid tokens ``V_b`` (``token_mask * sample_mask``, column 0 excluded: the
tokens the loss counts)::

    err_b    = (1 / |V_b|) * sum_{t in V_b} exp(|log pi_gen(t) - log pi_old(t)|)     # >= 1; 1 = exact agreement
    masked_b = err_b > threshold                                                   # only with a threshold set

``pi_gen`` is the engine that sampled the tokens, ``pi_old`` the trainer at the step's start. A row without valid
tokens has no error (NaN here) and is left out of every statistic; a non-finite per-token difference (a -inf
logprob) counts as an infinite error. ``token_mult_prob_error`` (:mod:`.losses`) is the same quantity pooled over
all the step's tokens; this per-sequence form finds the few sequences on which the engine and the trainer
disagree most (a stale or broken refit, a numerics bug), and with a threshold removes them from the loss.

Chunking contract: :func:`seq_logprob_error_metrics` returns per-micro-batch values that combine over a step as
:data:`~sc_lightning.algorithms.losses.METRIC_REDUCTIONS` says; its ``mean_*`` and ``masked_correct_pct``
entries are raw sums, which the step divides by its counts (valid rows, kept rows, masked rows).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["seq_logprob_error_mask", "seq_logprob_error_metrics", "seq_mult_prob_error"]


def seq_mult_prob_error(generation_logprobs: Tensor, prev_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``err_b`` per row: (B, T), (B, T), (B, T) mask -> (B,), NaN for a row with no valid token.

    Computed in float32 (float64 if the inputs are), without gradient.
    """
    dtype = torch.promote_types(prev_logprobs.dtype, torch.float32)
    valid = mask.bool().clone()
    valid[:, 0] = False  # nothing predicts the first token
    diff = (generation_logprobs.detach().to(dtype) - prev_logprobs.detach().to(dtype)).abs()  # (B, T)
    diff = torch.nan_to_num(diff, nan=torch.inf)  # -inf - -inf: no agreement can be shown
    per_token = torch.where(valid, torch.exp(diff), torch.zeros((), dtype=dtype, device=diff.device))  # (B, T)
    count = valid.sum(-1)  # (B,)
    mean = per_token.sum(-1) / count.clamp(min=1).to(dtype)
    return torch.where(count > 0, mean, torch.full_like(mean, torch.nan))


def seq_logprob_error_mask(errors: Tensor, threshold: float | None) -> Tensor:
    """(B,) bool: rows whose error (from :func:`seq_mult_prob_error`) is above ``threshold``.

    No row when ``threshold`` is None (metrics only); a row without valid tokens (NaN) is never masked.
    """
    if threshold is None:
        return torch.zeros_like(errors, dtype=torch.bool)
    return errors > threshold  # NaN compares False


def seq_logprob_error_metrics(errors: Tensor, masked: Tensor, rewards: Tensor) -> dict[str, Tensor]:
    """One micro-batch's statistics of ``errors`` (B,) before and after ``masked`` (B,), with ``rewards`` (B,).

    ``max_*`` / ``min_*`` are over the rows with valid tokens (-inf / +inf when there is none), ``mean_*`` the
    raw sum over those rows; the ``_after_mask`` forms use only the rows kept. ``num_masked_seqs_by_logprob_error``
    counts the masked rows and ``masked_correct_pct`` the masked rows whose reward is exactly 1 (a raw count: the
    step divides it by the masked rows, and reports 0 when none was masked).
    """
    checked = ~torch.isnan(errors)
    kept = checked & ~masked
    metrics = _summary(errors, checked, "")
    metrics.update(_summary(errors, kept, "_after_mask"))
    metrics["num_masked_seqs_by_logprob_error"] = masked.sum().to(errors.dtype)
    metrics["masked_correct_pct"] = (masked & (rewards.to(errors.device) == 1)).sum().to(errors.dtype)
    return metrics


def _summary(errors: Tensor, rows: Tensor, suffix: str) -> dict[str, Tensor]:
    """max, min and raw sum of ``errors`` over ``rows`` (B,) bool, named ``{max,min,mean}_seq_mult_prob_error…``."""
    zero = torch.zeros((), dtype=errors.dtype, device=errors.device)
    return {
        f"max_seq_mult_prob_error{suffix}": torch.where(rows, errors, -torch.inf).max(),
        f"min_seq_mult_prob_error{suffix}": torch.where(rows, errors, torch.inf).min(),
        f"mean_seq_mult_prob_error{suffix}": torch.where(rows, errors, zero).sum(),
    }
