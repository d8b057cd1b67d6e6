"""Policy and value losses: the clipped policy gradient with importance-sampling correction, and the clipped value loss.

Shape legend: ``B`` rows (sequences) of a micro-batch, ``T`` tokens per row (padded). Every per-token tensor is
aligned with ``input_ids``: position ``t`` holds the quantity for token ``t`` given tokens ``< t``; column 0 is
never a training token and the losses here ignore it whatever the mask says.

Three logprob sources (all (B, T)): ``logprobs`` = log pi_theta (live, with grad), ``prev_logprobs`` = log pi_old
(trainer at step start, no grad), ``generation_logprobs`` = log pi_gen (the inference engine that sampled the
tokens). Reference policy: ``reference_logprobs`` = log pi_ref.

Chunking contract: each loss returns ``raw_sum / normaliser`` where the normaliser is the *global* count for the
whole step (valid tokens, or valid sequences), passed in. Every quantity is row-local, so splitting a step into
micro-batches (or data-parallel shards) by rows and summing the returned losses, gradients and "sum" metrics gives
exactly the one-big-batch values. :data:`METRIC_REDUCTIONS` says how to combine each metric across micro-batches.

References: PPO clipping (Schulman et al. 2017, arXiv:1707.06347); dual clip (Ye et al. 2020, arXiv:1912.09729);
GSPO sequence ratios (Zheng et al. 2025, arXiv:2507.18071); truncated IS (Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training"); icepop (Ling Team 2025); KL estimators k1/k2/k3 (Schulman,
"Approximating KL divergence", 2020).

The two losses share the metric reductions and the chunking contract above, so they live together (past 400 lines).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from sc_lightning.config.algorithm import truncated_importance_sampling_issues

if TYPE_CHECKING:
    from sc_lightning.config.algorithm import LossConfig

__all__ = [
    "METRIC_REDUCTIONS",
    "ClippedPGLoss",
    "clipped_value_loss",
    "kl_estimate",
    "loss_mask",
    "valid_counts",
]

Reduction = Literal["sum", "min", "max", "mean"]

METRIC_REDUCTIONS: dict[str, Reduction] = {
    # ClippedPGLoss. "sum": already divided by the global count, so the step value is the sum over micro-batches.
    "loss": "sum",  # actor loss + beta * KL, as returned (the value that is backpropagated)
    "probs_ratio": "sum",  # mean over valid tokens of r = pi_theta / pi_old (GSPO: the sequence ratio per token)
    "probs_ratio_clamped": "sum",  # mean over valid tokens of clip(r, 1 - clip_min, 1 + clip_max)
    "probs_ratio_min": "min",  # min over valid tokens of r (+inf for a micro-batch without valid tokens)
    "probs_ratio_max": "max",  # max over valid tokens of r (-inf for a micro-batch without valid tokens)
    "probs_ratio_clamped_min": "min",  # min over valid tokens of clip(r)
    "probs_ratio_clamped_max": "max",  # max over valid tokens of clip(r)
    "kl_penalty": "sum",  # KL(pi_theta || pi_ref) reduced like the loss (the penalty divided by beta); 0 if beta = 0
    "token_mult_prob_error": "sum",  # mean over valid tokens of exp(|log pi_gen - log pi_old|); 1 = perfect match
    "gen_kl_error": "sum",  # KL(pi_gen || pi_old), k3 on tokens sampled from pi_gen: mean of w - 1 - log w
    "approx_entropy": "sum",  # H(pi_theta) ~ -mean over valid tokens of (pi_theta / pi_gen) * log pi_theta
    "sampling_importance_ratio": "sum",  # mean over valid tokens of the IS weight used (1 without correction)
    "is_oob_ratio": "sum",  # fraction of tokens (sequences for seq-mask-tis / GSPO) the IS truncation touched
    "num_valid_samples": "sum",  # rows with at least one valid token (a count, not a fraction)
    "advantage_abs_max": "max",  # max over valid tokens of |A|: one row's outsized advantage steers the whole step
    # clipped_value_loss
    "vf_clipfrac": "sum",  # fraction of valid tokens where the clipped value term was the larger one
    "values_mean": "sum",  # mean over valid tokens of V
    "returns_mean": "sum",  # mean over valid tokens of the return target R
    # seq_logprob_error (err_b = a row's mean exp|log pi_gen - log pi_old|); "sum" entries are raw sums that the
    # step divides by its valid rows (before masking), kept rows (_after_mask) or masked rows (masked_correct_pct)
    "max_seq_mult_prob_error": "max",  # max over rows with valid tokens of err_b
    "min_seq_mult_prob_error": "min",  # min over rows with valid tokens of err_b
    "mean_seq_mult_prob_error": "sum",  # mean over rows with valid tokens of err_b
    "max_seq_mult_prob_error_after_mask": "max",  # the same three over the rows the threshold kept
    "min_seq_mult_prob_error_after_mask": "min",
    "mean_seq_mult_prob_error_after_mask": "sum",
    "num_masked_seqs_by_logprob_error": "sum",  # rows masked by seq_logprob_error_threshold (a count)
    "masked_correct_pct": "sum",  # fraction of the masked rows with reward == 1 (0 when none was masked)
}
"""How each metric combines over the micro-batches (and data-parallel ranks) of one step."""


def loss_mask(token_mask: Tensor, sample_mask: Tensor) -> Tensor:
    """The loss mask ``token_mask * sample_mask`` with column 0 cleared: (B, T) and (B,) -> (B, T) float32."""
    mask = token_mask.float() * sample_mask.float().unsqueeze(-1)  # (B, T)
    mask[:, 0] = 0.0  # nothing predicts the first token
    return mask


def valid_counts(mask: Tensor) -> tuple[Tensor, Tensor]:
    """(valid tokens, valid sequences) of a (B, T) mask, as the losses count them (column 0 excluded).

    A valid sequence is a row with at least one valid token. Sum these over every micro-batch and
    data-parallel rank of a step to get the normalisers the losses take.
    """
    valid = mask.bool().clone()
    valid[:, 0] = False
    return valid.sum().float(), valid.any(-1).sum().float()


def kl_estimate(
    log_ratio: Tensor,
    kind: Literal["k1", "k2", "k3"],
    *,
    input_clamp: float | None = None,
    output_clamp: float | None = None,
) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from ``log_ratio = log pi_ref - log pi`` on tokens sampled from pi.

    ``k1 = -log_ratio`` (unbiased, can be negative), ``k2 = log_ratio^2 / 2``, ``k3 = e^log_ratio - 1 - log_ratio``
    (unbiased, >= 0). ``input_clamp`` bounds ``log_ratio`` to [-c, c] first; ``output_clamp`` bounds the
    estimate to [-c, c]. Same shape in and out.
    """
    if input_clamp is not None:
        log_ratio = log_ratio.clamp(-input_clamp, input_clamp)
    if kind == "k1":
        kl = -log_ratio
    elif kind == "k2":
        kl = 0.5 * log_ratio.square()
    elif kind == "k3":
        kl = torch.exp(log_ratio) - 1.0 - log_ratio
    else:
        raise ValueError(f"unknown KL estimator {kind!r}; expected 'k1', 'k2' or 'k3'")
    if output_clamp is not None:
        kl = kl.clamp(-output_clamp, output_clamp)
    return kl


@dataclass(frozen=True)
class _Reducer:
    """The valid-token geometry of one micro-batch and the step's global normalisers."""

    valid: Tensor  # (B, T) bool, column 0 cleared
    tokens_per_seq: Tensor  # (B,) float, valid tokens per row
    seq_valid: Tensor  # (B,) bool, row has a valid token
    num_tokens: Tensor  # () global valid tokens of the step (1 where 0 was passed)
    num_seqs: Tensor  # () global valid sequences of the step (1 where 0 was passed)

    @classmethod
    def build(cls, mask: Tensor, num_tokens: float | Tensor, num_seqs: float | Tensor, dtype: torch.dtype) -> _Reducer:
        """Geometry of ``mask`` (B, T) with the given global counts, as ``dtype`` scalars."""
        valid = mask.bool().clone()
        valid[:, 0] = False
        per_seq = valid.sum(-1).to(dtype)
        num_tokens_t, num_seqs_t = _normaliser(num_tokens, mask, dtype), _normaliser(num_seqs, mask, dtype)
        return cls(valid, per_seq, per_seq > 0, num_tokens_t, num_seqs_t)

    def masked(self, x: Tensor) -> Tensor:
        """``x`` (B, T) with every invalid position set to 0 (no NaN leaks from padding)."""
        return torch.where(self.valid, x, torch.zeros((), dtype=x.dtype, device=x.device))

    def token_mean(self, x: Tensor) -> Tensor:
        """sum over valid tokens of ``x`` (B, T) / global valid tokens."""
        return self.masked(x).sum() / self.num_tokens

    def seq_mean(self, x: Tensor) -> Tensor:
        """sum over valid rows of (token mean of ``x`` (B, T) in the row) / global valid sequences."""
        per_seq = self.masked(x).sum(-1) / self.tokens_per_seq.clamp(min=1.0)  # (B,)
        return per_seq.sum() / self.num_seqs

    def reduce(self, x: Tensor, token_level: bool) -> Tensor:
        """The loss reduction: :meth:`token_mean` if ``token_level`` else :meth:`seq_mean`."""
        return self.token_mean(x) if token_level else self.seq_mean(x)

    def extreme(self, x: Tensor, largest: bool) -> Tensor:
        """max (``largest``) or min over valid tokens of ``x``; -inf / +inf when there is none."""
        fill = -torch.inf if largest else torch.inf
        filled = torch.where(self.valid, x, fill)
        return filled.max() if largest else filled.min()


def _compute_dtype(x: Tensor) -> torch.dtype:
    """float32, or float64 when ``x`` is float64: half-precision logprobs are upcast before any exp."""
    return torch.promote_types(x.dtype, torch.float32)


def _normaliser(n: float | Tensor, like: Tensor, dtype: torch.dtype) -> Tensor:
    """A global count as a ``dtype`` scalar on ``like``'s device; 0 (an empty step) becomes 1 so sums stay 0."""
    t = torch.as_tensor(n, dtype=dtype, device=like.device)
    return torch.where(t > 0, t, torch.ones_like(t))


TruncationType = Literal["tis", "icepop", "seq-mask-tis"]


@dataclass(frozen=True, kw_only=True)
class ClippedPGLoss:
    """Clipped policy-gradient loss (PPO/GRPO/GSPO) with importance-sampling correction and a KL penalty.

    Per valid token, with advantage ``A``, ratio ``r`` and IS weight ``w`` (detached)::

        r        = exp(log pi_theta - log pi_old)            # GSPO: exp(mean_t(...)) of the row, per token
        loss_t   = max(-A * r, -A * clip(r, 1 - clip_min, 1 + clip_max))
        loss_t   = min(loss_t, -A * c)        where A < 0    # dual clip, if ratio_clip_c is set
        w        = exp(log pi_old - log pi_gen)              # GSPO: exp(sum_t(...)) of the row; 1 without IS
        kl_t     = u * k(log pi_ref - log pi_theta)          # u = exp(lp - sg(lp)) or sg(pi_theta / pi_gen)
        loss     = reduce(w * loss_t) + beta * reduce(kl_t)

    ``reduce`` is token-level (sum over valid tokens / global valid tokens) or sequence-level (per-row token mean,
    summed over rows / global valid sequences). A non-finite IS weight (NaN or inf, e.g. from a -inf generation
    logprob) is 0 under every truncation variant. With ``force_on_policy_ratio``, ``log pi_old`` is
    ``logprobs.detach()`` everywhere (ratio, IS weights, metrics) and ``prev_logprobs`` may be None.

    Fields are :class:`~sc_lightning.config.algorithm.LossConfig`'s knobs, same names and defaults;
    :meth:`from_config` builds one from that section.
    """

    reference_policy_kl_penalty: float = 0.01
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"
    kl_input_clamp_value: float | None = 20.0
    kl_output_clamp_value: float | None = 10.0
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    ratio_clip_c: float | None = None
    use_on_policy_kl_approximation: bool = False
    use_importance_sampling_correction: bool = True
    truncated_importance_sampling_type: TruncationType | None = None
    truncated_importance_sampling_ratio: float | None = None
    truncated_importance_sampling_ratio_min: float | None = None
    token_level_loss: bool = True
    force_on_policy_ratio: bool = False
    sequence_level_importance_ratios: bool = False

    def __post_init__(self) -> None:
        truncation = truncated_importance_sampling_issues(
            self.truncated_importance_sampling_type,
            self.truncated_importance_sampling_ratio,
            self.truncated_importance_sampling_ratio_min,
            use_importance_sampling_correction=self.use_importance_sampling_correction,
            sequence_level_importance_ratios=self.sequence_level_importance_ratios,
        )
        problems = [f"{knob} {problem}" for knob, problem in truncation]
        if self.ratio_clip_c is not None and self.ratio_clip_c <= 1:
            problems.append(f"ratio_clip_c must be > 1, got {self.ratio_clip_c}")
        if self.reference_policy_kl_type not in ("k1", "k2", "k3"):
            problems.append(f"unknown reference_policy_kl_type {self.reference_policy_kl_type!r}")
        if problems:
            raise ValueError("invalid ClippedPGLoss: " + "; ".join(problems))

    @classmethod
    def from_config(cls, config: LossConfig) -> ClippedPGLoss:
        """The loss configured by a ``loss_fn:`` section."""
        return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(cls)})

    def __call__(
        self,
        logprobs: Tensor,
        *,
        prev_logprobs: Tensor | None,
        generation_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        num_valid_tokens: float | Tensor,
        num_valid_seqs: float | Tensor,
        reference_logprobs: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss of one micro-batch and its metrics.

        Args:
            logprobs: (B, T) log pi_theta of each token, with grad.
            prev_logprobs: (B, T) log pi_old; ignored (may be None) with ``force_on_policy_ratio``.
            generation_logprobs: (B, T) log pi_gen from the inference engine.
            advantages: (B, T) per-token advantages.
            mask: (B, T) ``token_mask * sample_mask``; column 0 is ignored whatever it holds.
            num_valid_tokens: valid tokens of the whole step (see :func:`valid_counts`).
            num_valid_seqs: valid sequences of the whole step.
            reference_logprobs: (B, T) log pi_ref; required when ``reference_policy_kl_penalty > 0``.

        Returns:
            ``(loss, metrics)``: the scalar loss (raw sum / global normaliser) to backpropagate, and detached
            scalar metrics combined across micro-batches as :data:`METRIC_REDUCTIONS` says.
        """
        dtype = _compute_dtype(logprobs)
        red = _Reducer.build(mask, num_valid_tokens, num_valid_seqs, dtype)
        lp = logprobs.to(dtype)
        if self.force_on_policy_ratio:
            prev = lp.detach()
        elif prev_logprobs is None:
            raise ValueError("prev_logprobs is required unless force_on_policy_ratio is set")
        else:
            prev = prev_logprobs.detach().to(dtype)
        gen = generation_logprobs.detach().to(dtype)
        adv = red.masked(advantages.detach().to(dtype))

        ratio = torch.exp(self._log_ratio(lp, prev, red))  # (B, T), 1 at invalid positions
        clamped = ratio.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        token_loss = torch.maximum(-adv * ratio, -adv * clamped)  # (B, T)
        if self.ratio_clip_c is not None:
            token_loss = torch.where(adv < 0, torch.minimum(token_loss, -adv * self.ratio_clip_c), token_loss)
        weights, oob = self._importance_weights(prev, gen, red)  # (B, T), ()
        loss = red.reduce(weights * token_loss, self.token_level_loss)

        kl = torch.zeros((), dtype=dtype, device=lp.device)
        if self.reference_policy_kl_penalty > 0:
            if reference_logprobs is None:
                raise ValueError("reference_logprobs is required when reference_policy_kl_penalty > 0")
            kl_tokens = self._kl_per_token(lp, reference_logprobs.detach().to(dtype), gen, red)  # (B, T)
            kl = red.reduce(kl_tokens, self.token_level_loss)
            loss = loss + self.reference_policy_kl_penalty * kl

        metrics = _policy_metrics(red, lp.detach(), prev, gen, ratio.detach(), clamped.detach(), weights)
        metrics.update(
            loss=loss.detach(),
            kl_penalty=kl.detach(),
            is_oob_ratio=oob,
            advantage_abs_max=red.extreme(adv.abs(), largest=True),
        )
        return loss, metrics

    def _log_ratio(self, lp: Tensor, prev: Tensor, red: _Reducer) -> Tensor:
        """log r per token (B, T), 0 at invalid positions; GSPO: the row's mean log-ratio on each valid token."""
        log_ratio = red.masked(lp - prev)
        if self.sequence_level_importance_ratios:
            per_seq = log_ratio.sum(-1) / red.tokens_per_seq.clamp(min=1.0)  # (B,) mean_t (lp - prev)
            log_ratio = red.masked(per_seq.unsqueeze(-1).expand_as(log_ratio))
        return log_ratio

    def _importance_weights(self, prev: Tensor, gen: Tensor, red: _Reducer) -> tuple[Tensor, Tensor]:
        """Detached IS weights pi_old / pi_gen (B, T), truncated as configured, and the ``is_oob_ratio`` metric."""
        zero = torch.zeros((), dtype=prev.dtype, device=prev.device)
        if not self.use_importance_sampling_correction:
            return red.valid.to(prev.dtype), zero
        log_w = red.masked(prev - gen)  # (B, T) log(pi_old / pi_gen)
        per_seq = self.sequence_level_importance_ratios
        w = torch.exp(log_w.sum(-1)) if per_seq else torch.exp(log_w)  # (B,) GSPO, else (B, T)
        finite = torch.isfinite(w)
        kind = self.truncated_importance_sampling_type
        lo = self.truncated_importance_sampling_ratio_min or 0.0
        hi = self.truncated_importance_sampling_ratio
        oob = zero
        if kind == "seq-mask-tis":  # geometric mean of the row's token ratios: exp(mean_t log w)
            geo = torch.exp(log_w.sum(-1) / red.tokens_per_seq.clamp(min=1.0))  # (B,)
            inside = (geo >= lo) & (geo <= hi)  # NaN compares False: out of bounds
            w = torch.where(inside if per_seq else inside.unsqueeze(-1), w, 0.0)
            oob = (~inside & red.seq_valid).sum() / red.num_seqs
        elif kind is not None:
            inside = (w >= lo) & (w <= hi)
            w = w.clamp(lo, hi) if kind == "tis" else torch.where(inside, w, 0.0)  # icepop: drop, tis: clamp
            oob = (~inside & red.seq_valid).sum() / red.num_seqs if per_seq else red.token_mean((~inside).to(w.dtype))
        w = torch.where(finite, w, 0.0)
        if per_seq:
            w = w.unsqueeze(-1).expand_as(log_w)
        return red.masked(w), oob

    def _kl_per_token(self, lp: Tensor, ref: Tensor, gen: Tensor, red: _Reducer) -> Tensor:
        """Weighted per-token KL(pi_theta || pi_ref) estimate (B, T), with grad through ``lp``."""
        kl = kl_estimate(
            red.masked(ref - lp),
            self.reference_policy_kl_type,
            input_clamp=self.kl_input_clamp_value,
            output_clamp=self.kl_output_clamp_value,
        )
        if self.use_on_policy_kl_approximation:  # sg(pi_theta / pi_gen): tokens were sampled from pi_gen
            weight = torch.exp(red.masked(lp.detach() - gen))
            weight = torch.where(torch.isfinite(weight), weight, 0.0)
        else:  # value 1, gradient d lp: adds the score-function term k * grad log pi_theta
            weight = torch.exp(red.masked(lp - lp.detach()))
        return weight * kl


def _policy_metrics(
    red: _Reducer, lp: Tensor, prev: Tensor, gen: Tensor, ratio: Tensor, clamped: Tensor, weights: Tensor
) -> dict[str, Tensor]:
    """The detached diagnostics of :class:`ClippedPGLoss` (all inputs (B, T), detached)."""
    log_w = red.masked(prev - gen)  # log(pi_old / pi_gen)
    entropy_weight = torch.exp(red.masked(lp - gen))  # pi_theta / pi_gen
    return {
        "probs_ratio": red.token_mean(ratio),
        "probs_ratio_clamped": red.token_mean(clamped),
        "probs_ratio_min": red.extreme(ratio, largest=False),
        "probs_ratio_max": red.extreme(ratio, largest=True),
        "probs_ratio_clamped_min": red.extreme(clamped, largest=False),
        "probs_ratio_clamped_max": red.extreme(clamped, largest=True),
        "token_mult_prob_error": red.token_mean(torch.exp(log_w.abs())),
        "gen_kl_error": red.token_mean(torch.exp(log_w) - 1.0 - log_w),
        "approx_entropy": -red.token_mean(entropy_weight * lp),
        "sampling_importance_ratio": red.token_mean(weights),
        "num_valid_samples": red.seq_valid.sum().to(lp.dtype),
    }


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_epsilon: float | None,
    coef: float = 1.0,
    num_valid_tokens: float | Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO critic loss, token-level: ``coef * 0.5 * max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2)``.

    All tensors (B, T), ``values`` with grad; column 0 is ignored. ``clip_epsilon=None`` drops the clipped term.
    Returns ``(raw sum over valid tokens / num_valid_tokens, metrics)`` with metrics ``loss``, ``vf_clipfrac``,
    ``values_mean`` and ``returns_mean`` (see :data:`METRIC_REDUCTIONS`).
    """
    dtype = _compute_dtype(values)
    red = _Reducer.build(mask, num_valid_tokens, 1.0, dtype)
    v, v_old, target = values.to(dtype), old_values.detach().to(dtype), returns.detach().to(dtype)
    unclipped = red.masked(v - target).square()
    if clip_epsilon is None:
        per_token, clipped_wins = unclipped, torch.zeros_like(red.valid)
    else:
        v_clipped = v_old + (v - v_old).clamp(-clip_epsilon, clip_epsilon)
        clipped = red.masked(v_clipped - target).square()
        per_token = torch.maximum(unclipped, clipped)
        clipped_wins = clipped.detach() > unclipped.detach()
    loss = coef * 0.5 * red.token_mean(per_token)
    metrics = {
        "loss": loss.detach(),
        "vf_clipfrac": red.token_mean(clipped_wins.to(dtype)),
        "values_mean": red.token_mean(v.detach()),
        "returns_mean": red.token_mean(target),
    }
    return loss, metrics
