"""ClippedPGLoss and the value loss: one hand-computed test per branch, with the arithmetic next to each number.

Rows carry a prompt token in column 0 (never trained on), like the trainer's rows aligned with ``input_ids``.
One file (past 400 lines) because each branch's test is a short worked example sharing the same row builders.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from sc_lightning.algorithms import ClippedPGLoss, clipped_value_loss, kl_estimate, loss_mask, valid_counts
from sc_lightning.config.algorithm import LossConfig

LN2 = math.log(2.0)
NAN, INF = math.nan, math.inf

# Only the clipped surrogate: no KL, no importance weights (turned on per test).
PLAIN = {"reference_policy_kl_penalty": 0.0, "use_importance_sampling_correction": False}


def run(
    loss_fn: ClippedPGLoss,
    *,
    lp: list,
    adv: list,
    mask: list,
    prev: list | None = None,
    gen: list | None = None,
    ref: list | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[float, dict[str, float], torch.Tensor]:
    """(loss, metrics, d loss / d logprobs) for a batch given as nested lists; prev and gen default to lp."""
    logprobs = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    mask_t = torch.tensor(mask, dtype=torch.int8)
    tokens, seqs = valid_counts(mask_t)
    loss, metrics = loss_fn(
        logprobs,
        prev_logprobs=torch.tensor(prev if prev is not None else lp, dtype=torch.float64),
        generation_logprobs=torch.tensor(gen if gen is not None else (prev if prev is not None else lp)).double(),
        reference_logprobs=None if ref is None else torch.tensor(ref, dtype=torch.float64),
        advantages=torch.tensor(adv, dtype=torch.float64),
        mask=mask_t,
        num_valid_tokens=tokens if num_tokens is None else num_tokens,
        num_valid_seqs=seqs if num_seqs is None else num_seqs,
    )
    loss.backward()
    return loss.item(), {k: v.item() for k, v in metrics.items()}, logprobs.grad


def one_token(log_ratio: float, advantage: float, **config: object) -> tuple[float, float]:
    """(loss, gradient) for one completion token with log(pi/pi_old) = log_ratio."""
    loss, _, grad = run(
        ClippedPGLoss(**{**PLAIN, **config}),
        lp=[[0.0, -1.0 + log_ratio]],
        prev=[[0.0, -1.0]],
        adv=[[0.0, advantage]],
        mask=[[0, 1]],
    )
    return loss, grad[0, 1].item()


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-6, abs=1e-9)


# ---------------------------------------------------------------- ratio and clipping


def test_unclipped_ratio() -> None:
    loss, grad = one_token(0.1, 2.0)
    assert loss == approx(-2 * math.exp(0.1))  # r = e^0.1 = 1.10517 inside [0.8, 1.2]; -A r = -2.21034
    assert grad == approx(-2 * math.exp(0.1))  # d(-A e^(lp - prev))/d lp = -A r


def test_clipped_above_with_positive_advantage() -> None:
    loss, grad = one_token(0.5, 2.0)
    assert loss == approx(-2.4)  # r = e^0.5 = 1.6487 clipped to 1.2; max(-3.2974, -2 * 1.2) = -2.4
    assert grad == 0.0  # the clipped branch carries no gradient


def test_high_ratio_with_negative_advantage_is_not_clipped() -> None:
    loss, grad = one_token(0.5, -1.0)
    assert loss == approx(math.exp(0.5))  # max(1 * 1.6487, 1 * 1.2) = 1.6487 (pessimistic branch)
    assert grad == approx(math.exp(0.5))  # -A r = 1.6487


def test_clipped_below_with_negative_advantage() -> None:
    loss, grad = one_token(-0.5, -1.0)
    assert loss == approx(0.8)  # r = e^-0.5 = 0.6065 clipped to 0.8; max(0.6065, 0.8) = 0.8
    assert grad == 0.0


def test_low_ratio_with_positive_advantage_is_not_clipped() -> None:
    loss, grad = one_token(-0.5, 1.0)
    assert loss == approx(-math.exp(-0.5))  # max(-0.6065, -0.8) = -0.6065
    assert grad == approx(-math.exp(-0.5))


def test_asymmetric_clip_bounds() -> None:
    loss, _ = one_token(0.5, 1.0, ratio_clip_max=0.28)
    assert loss == approx(-1.28)  # r = 1.6487 clipped to 1 + 0.28
    loss, _ = one_token(-0.5, -1.0, ratio_clip_min=0.3)
    assert loss == approx(0.7)  # r = 0.6065 clipped to 1 - 0.3; max(0.6065, 0.7)


def test_dual_clip_caps_negative_advantage_losses() -> None:
    loss, grad = one_token(1.5, -1.0, ratio_clip_c=3.0)
    assert loss == approx(3.0)  # r = e^1.5 = 4.4817; max(4.4817, 1.2) = 4.4817; min(4.4817, -A c = 3) = 3
    assert grad == 0.0
    loss, _ = one_token(0.5, -1.0, ratio_clip_c=3.0)
    assert loss == approx(math.exp(0.5))  # 1.6487 < 3: untouched
    loss, _ = one_token(1.5, 1.0, ratio_clip_c=3.0)
    assert loss == approx(-1.2)  # A > 0: dual clip does not apply; ordinary clip to 1.2


def test_force_on_policy_ratio_is_one_with_the_policy_gradient() -> None:
    loss_fn = ClippedPGLoss(**PLAIN, force_on_policy_ratio=True)
    lp = torch.tensor([[0.0, -0.7]], dtype=torch.float64, requires_grad=True)
    loss, metrics = loss_fn(
        lp,
        prev_logprobs=None,  # not needed: pi_old := sg(pi_theta)
        generation_logprobs=torch.tensor([[0.0, -0.7]], dtype=torch.float64),
        advantages=torch.tensor([[0.0, 2.0]], dtype=torch.float64),
        mask=torch.tensor([[0, 1]]),
        num_valid_tokens=1,
        num_valid_seqs=1,
    )
    loss.backward()
    assert loss.item() == approx(-2.0)  # r = exp(lp - sg(lp)) = 1; -A r = -2
    assert lp.grad[0, 1].item() == approx(-2.0)  # gradient = -A * d lp
    assert metrics["probs_ratio"].item() == 1.0


def test_force_on_policy_ratio_also_replaces_prev_in_the_importance_weights() -> None:
    loss_fn = ClippedPGLoss(reference_policy_kl_penalty=0.0, force_on_policy_ratio=True)  # IS on by default
    loss, _, _ = run(
        loss_fn, lp=[[0.0, -1.0]], prev=[[0.0, -50.0]], gen=[[0.0, -1.0 - LN2]], adv=[[0, 1.0]], mask=[[0, 1]]
    )
    assert loss == approx(-2.0)  # w = exp(sg(lp) - gen) = exp(ln 2) = 2 (prev = -50 ignored); r = 1; -A w = -2


def test_gspo_uses_one_ratio_per_sequence() -> None:
    loss_fn = ClippedPGLoss(**PLAIN, sequence_level_importance_ratios=True)
    loss, metrics, grad = run(
        loss_fn, lp=[[0.0, 0.05, 0.15]], prev=[[0.0, 0.0, 0.0]], adv=[[0, 1.0, 1.0]], mask=[[0, 1, 1]]
    )
    r = math.exp(0.1)  # exp(mean(0.05, 0.15)) = e^0.1 = 1.10517 on both tokens
    assert loss == approx(-r)  # (-r - r) / 2 tokens
    assert grad[0, 1:].tolist() == [approx(-r / 2)] * 2  # d(-r)/d lp_t = -r * (1/2): each token owns half the mean
    assert metrics["probs_ratio"] == approx(r)


def test_gspo_clips_the_sequence_ratio_not_the_token_ratios() -> None:
    batch = {"lp": [[0.0, 0.1, 0.3]], "prev": [[0.0, 0.0, 0.0]], "adv": [[0, 1.0, 1.0]], "mask": [[0, 1, 1]]}
    gspo, _, _ = run(ClippedPGLoss(**PLAIN, sequence_level_importance_ratios=True), **batch)
    assert gspo == approx(-1.2)  # r = e^mean(0.1, 0.3) = e^0.2 = 1.2214 -> 1.2 on both tokens
    token, _, _ = run(ClippedPGLoss(**PLAIN), **batch)
    assert token == approx(-(math.exp(0.1) + 1.2) / 2)  # r = [1.1052, e^0.3 = 1.3499 -> 1.2]; -2.3052 / 2


# ---------------------------------------------------------------- reductions and masking

TWO_ROWS = {
    "lp": [[0.0, -1.0, 0.0, 0.0], [0.0, -1.0, -1.0, -1.0]],
    "adv": [[0.0, 3.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]],
    "mask": [[0, 1, 0, 0], [0, 1, 1, 1]],  # row 0: 1 valid token, row 1: 3
}


def test_token_level_loss_divides_by_valid_tokens() -> None:
    loss, _, _ = run(ClippedPGLoss(**PLAIN), **TWO_ROWS)
    assert loss == approx(-1.5)  # r = 1; token losses -3, -1, -1, -1; sum -6 / 4 tokens


def test_sequence_level_loss_averages_rows_then_divides_by_valid_sequences() -> None:
    loss, _, grad = run(ClippedPGLoss(**PLAIN, token_level_loss=False), **TWO_ROWS)
    assert loss == approx(-2.0)  # row means -3 / 1 and -3 / 3 = -1; (-3 - 1) / 2 sequences
    assert grad[1, 1].item() == approx(-1 / 3 / 2)  # -A r / 3 tokens / 2 sequences


def test_the_given_global_normaliser_is_used() -> None:
    loss, _, _ = run(ClippedPGLoss(**PLAIN), **TWO_ROWS, num_tokens=8)
    assert loss == approx(-6 / 8)  # raw sum -6 over a step of 8 valid tokens
    loss, _, _ = run(ClippedPGLoss(**PLAIN, token_level_loss=False), **TWO_ROWS, num_seqs=5)
    assert loss == approx(-4 / 5)  # raw sum of row means -4 over a step of 5 valid sequences


def test_column_zero_and_padding_garbage_are_ignored() -> None:
    loss, metrics, grad = run(
        ClippedPGLoss(reference_policy_kl_penalty=0.1),  # IS on, KL on
        lp=[[NAN, -1.0, NAN]],
        prev=[[INF, -1.0, NAN]],
        gen=[[-INF, -1.0, INF]],
        ref=[[NAN, -1.0, -INF]],
        adv=[[5.0, 1.0, NAN]],
        mask=[[1, 1, 0]],  # column 0 flagged valid by mistake: ignored
    )
    assert loss == approx(-1.0)  # only token 1: r = 1, w = 1, A = 1; KL of identical logprobs = 0
    assert grad.tolist() == [[0.0, -1.0, 0.0]]
    assert all(math.isfinite(v) for v in metrics.values())


def test_loss_mask_and_valid_counts_exclude_column_zero() -> None:
    mask = loss_mask(torch.tensor([[1, 1, 1], [1, 0, 0], [0, 1, 0]]), torch.tensor([1.0, 1.0, 0.0]))
    assert mask.tolist() == [[0, 1, 1], [0, 0, 0], [0, 0, 0]]  # col 0 cleared; row 2 has sample_mask 0
    tokens, seqs = valid_counts(torch.tensor([[1, 1, 1], [1, 0, 0], [0, 1, 0]]))
    assert (tokens.item(), seqs.item()) == (3, 2)  # row 0: 2 tokens, row 1: none past col 0, row 2: 1


def test_a_micro_batch_without_valid_tokens_contributes_nothing() -> None:
    loss, metrics, grad = run(
        ClippedPGLoss(), lp=[[0.0, -1.0]], adv=[[0.0, 1.0]], ref=[[0, -2.0]], mask=[[0, 0]], num_tokens=4, num_seqs=2
    )
    assert loss == 0.0 and grad.abs().sum() == 0.0
    assert metrics["probs_ratio_min"] == INF and metrics["probs_ratio_max"] == -INF  # identities of min / max
    assert metrics["probs_ratio"] == 0.0 and metrics["num_valid_samples"] == 0.0
    assert metrics["advantage_abs_max"] == -INF


# ---------------------------------------------------------------- importance-sampling correction

IS = {"reference_policy_kl_penalty": 0.0, "use_importance_sampling_correction": True}


def three_tokens(weights: list[float], **config: object) -> tuple[float, dict[str, float], torch.Tensor]:
    """One row of three tokens with r = 1, A = 1 and IS weights pi_old / pi_gen = ``weights``."""
    prev = [0.0, -1.0, -1.0, -1.0]
    gen = [0.0] + [-1.0 - math.log(w) if w > 0 else (NAN if math.isnan(w) else -INF) for w in weights]
    return run(
        ClippedPGLoss(**{**IS, **config}), lp=[prev], prev=[prev], gen=[gen], adv=[[0.0, 1, 1, 1]], mask=[[0, 1, 1, 1]]
    )


def test_importance_weights_scale_the_token_losses() -> None:
    off, _, _ = run(ClippedPGLoss(**PLAIN), lp=[[0.0, -1.0]], gen=[[0.0, -1.0 - LN2]], adv=[[0, 1.0]], mask=[[0, 1]])
    assert off == approx(-1.0)  # no correction: -A r = -1
    on, metrics, grad = run(
        ClippedPGLoss(**IS), lp=[[0.0, -1.0]], gen=[[0.0, -1.0 - LN2]], adv=[[0, 1.0]], mask=[[0, 1]]
    )
    assert on == approx(-2.0)  # w = exp(prev - gen) = exp(ln 2) = 2; -A w r = -2
    assert grad[0, 1].item() == approx(-2.0)  # w is detached: gradient -A w r
    assert metrics["sampling_importance_ratio"] == approx(2.0)


@pytest.mark.parametrize("kind", [None, "tis", "icepop", "seq-mask-tis"])
def test_non_finite_weights_become_zero(kind: str | None) -> None:
    bounds = (
        {"truncated_importance_sampling_ratio": 4.0, "truncated_importance_sampling_ratio_min": 0.1} if kind else {}
    )
    # gen = -inf gives w = inf, gen = NaN gives w = NaN: both weigh 0 (even though tis would clamp inf to 4)
    loss, metrics, grad = three_tokens([2.0, INF, NAN], truncated_importance_sampling_type=kind, **bounds)
    if kind == "seq-mask-tis":
        assert loss == 0.0  # geometric mean of the row is non-finite -> the whole row is out of bounds
    else:
        assert loss == approx(-2 / 3)  # w = [2, 0, 0]; -(2 + 0 + 0) / 3 tokens
    assert torch.isfinite(grad).all() and math.isfinite(metrics["loss"])


def test_tis_clamps_weights_to_the_upper_bound() -> None:
    loss, metrics, _ = three_tokens(
        [0.5, 3.0, 1.0], truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0
    )
    assert loss == approx(-3.5 / 3)  # w = [0.5, 3 -> 2, 1]; -(0.5 + 2 + 1) / 3 = -1.16667
    assert metrics["is_oob_ratio"] == approx(1 / 3)  # one of three tokens clamped
    assert metrics["sampling_importance_ratio"] == approx(3.5 / 3)


def test_tis_with_a_lower_bound() -> None:
    loss, metrics, _ = three_tokens(
        [0.5, 3.0, 1.0],
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_ratio_min=0.6,
    )
    assert loss == approx(-3.6 / 3)  # w = [0.5 -> 0.6, 3 -> 2, 1]; -(0.6 + 2 + 1) / 3 = -1.2
    assert metrics["is_oob_ratio"] == approx(2 / 3)


def test_icepop_drops_tokens_outside_the_bounds() -> None:
    loss, metrics, grad = three_tokens(
        [0.5, 3.0, 1.0],
        truncated_importance_sampling_type="icepop",
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_ratio_min=0.6,
    )
    assert loss == approx(-1 / 3)  # w = [0.5 -> 0, 3 -> 0, 1]; -1 / 3 tokens
    assert metrics["is_oob_ratio"] == approx(2 / 3)
    assert grad[0, 1:].tolist() == [0.0, 0.0, approx(-1 / 3)]


def test_seq_mask_tis_drops_whole_sequences_by_geometric_mean() -> None:
    prev = [0.0, -1.0, -1.0]
    loss, metrics, _ = run(
        ClippedPGLoss(
            **IS,
            truncated_importance_sampling_type="seq-mask-tis",
            truncated_importance_sampling_ratio=2.0,
            truncated_importance_sampling_ratio_min=0.5,
        ),
        lp=[prev, prev],
        prev=[prev, prev],
        gen=[[0.0, -1.0 - math.log(4.0), -1.0 - math.log(0.5)], [0.0, -1.0 - math.log(3.0), -1.0 - math.log(3.0)]],
        adv=[[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]],
        mask=[[0, 1, 1], [0, 1, 1]],
    )
    # row 0: w = [4, 0.5], geometric mean sqrt(4 * 0.5) = 1.414 in [0.5, 2] -> kept with its raw token weights
    # row 1: w = [3, 3], geometric mean 3 > 2 -> dropped
    assert loss == approx(-(4 + 0.5) / 4)  # -(4 + 0.5 + 0 + 0) / 4 tokens = -1.125
    assert metrics["is_oob_ratio"] == approx(1 / 2)  # one of two sequences


def gspo_row(**config: object) -> tuple[float, dict[str, float], torch.Tensor]:
    """One row, r = 1, A = 1, token IS log-weights [ln 2, ln 1.5] -> GSPO sequence weight 2 * 1.5 = 3."""
    prev = [0.0, -1.0, -1.0]
    gen = [0.0, -1.0 - LN2, -1.0 - math.log(1.5)]
    loss_fn = ClippedPGLoss(**IS, sequence_level_importance_ratios=True, **config)
    return run(loss_fn, lp=[prev], prev=[prev], gen=[gen], adv=[[0.0, 1.0, 1.0]], mask=[[0, 1, 1]])


def test_gspo_importance_weight_is_the_product_over_the_sequence() -> None:
    loss, _, _ = gspo_row()
    assert loss == approx(-3.0)  # w = exp(ln 2 + ln 1.5) = 3 on both tokens; -(3 + 3) / 2


def test_gspo_truncation_counts_sequences() -> None:
    loss, metrics, _ = gspo_row(truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0)
    assert loss == approx(-2.0)  # w = 3 clamped to 2 on both tokens
    assert metrics["is_oob_ratio"] == approx(1.0)  # 1 of 1 sequence
    loss, _, _ = gspo_row(
        truncated_importance_sampling_type="icepop",
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_ratio_min=0.5,
    )
    assert loss == 0.0  # w = 3 outside [0.5, 2] -> 0


def test_truncation_settings_are_validated() -> None:
    """The loss reports from the same rules as the config validation (config.algorithm)."""
    with pytest.raises(ValueError, match="'tis' without loss_fn.use_importance_sampling_correction: true"):
        ClippedPGLoss(**PLAIN, truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0)
    with pytest.raises(ValueError, match="truncated_importance_sampling_ratio is required by .* 'tis'"):
        ClippedPGLoss(truncated_importance_sampling_type="tis")
    with pytest.raises(ValueError, match="ratio_min is required by .* 'icepop'"):
        ClippedPGLoss(truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=2.0)
    with pytest.raises(ValueError, match=r"ratio_min \(3.0\) exceeds truncated_importance_sampling_ratio \(2.0\)"):
        ClippedPGLoss(
            truncated_importance_sampling_type="icepop",
            truncated_importance_sampling_ratio=2.0,
            truncated_importance_sampling_ratio_min=3.0,
        )
    with pytest.raises(ValueError, match="ratio_clip_c"):
        ClippedPGLoss(ratio_clip_c=1.0)


# ---------------------------------------------------------------- KL penalty


def kl_row(kind: str, ref_shift: float, **config: object) -> tuple[float, dict[str, float], torch.Tensor]:
    """One token, A = 0 (no actor loss), beta = 0.1, log pi_ref - log pi = ref_shift."""
    loss_fn = ClippedPGLoss(**{**IS, "reference_policy_kl_penalty": 0.1, "reference_policy_kl_type": kind, **config})
    return run(loss_fn, lp=[[0.0, -1.0]], ref=[[0.0, -1.0 + ref_shift]], adv=[[0.0, 0.0]], mask=[[0, 1]])


def test_kl_k1() -> None:
    loss, metrics, grad = kl_row("k1", -0.5)
    assert metrics["kl_penalty"] == approx(0.5)  # k1 = -log r = 0.5
    assert loss == approx(0.05)  # beta * 0.5
    # weight exp(lp - sg(lp)) adds k * d lp: d(w k1)/d lp = k1 + d(lp - ref)/d lp = 0.5 + 1; times beta
    assert grad[0, 1].item() == approx(0.1 * 1.5)


def test_kl_k2() -> None:
    loss, metrics, grad = kl_row("k2", -0.5)
    assert metrics["kl_penalty"] == approx(0.125)  # (-0.5)^2 / 2
    assert loss == approx(0.0125)
    assert grad[0, 1].item() == approx(0.1 * (0.125 + 0.5))  # k2 + d((ref - lp)^2 / 2)/d lp = 0.125 + 0.5


def test_kl_k3() -> None:
    loss, metrics, grad = kl_row("k3", -0.5)
    k3 = math.exp(-0.5) - 1 + 0.5  # e^-0.5 - 1 + 0.5 = 0.10653
    assert metrics["kl_penalty"] == approx(k3)
    assert loss == approx(0.1 * k3)
    assert grad[0, 1].item() == approx(0.1 * 0.5)  # k3 + (1 - e^-0.5) = 0.10653 + 0.39347 = 0.5


def test_kl_estimator_clamps() -> None:
    x = torch.tensor([-30.0, 30.0, -0.5])
    # input clamp 20 -> log r = [-20, 20, -0.5]; k1 = [20, -20, 0.5]; output clamp 10 -> [10, -10, 0.5]
    assert kl_estimate(x, "k1", input_clamp=20.0, output_clamp=10.0).tolist() == [10.0, -10.0, 0.5]
    assert kl_estimate(x, "k1").tolist() == [30.0, -30.0, 0.5]  # no clamps
    # k3(-20) = e^-20 - 1 + 20 = 19.000000002; k3(20) = e^20 - 21 = 4.85e8
    k3 = kl_estimate(x, "k3", input_clamp=20.0)
    assert k3[0].item() == pytest.approx(19.0) and k3[1].item() == pytest.approx(math.exp(20) - 21, rel=1e-5)
    assert kl_estimate(x, "k3", input_clamp=20.0, output_clamp=10.0)[:2].tolist() == [10.0, 10.0]
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(x, "k4")  # type: ignore[arg-type]


def test_kl_clamps_inside_the_loss() -> None:
    _, metrics, grad = kl_row("k1", -30.0)  # defaults: input clamp 20, output clamp 10
    assert metrics["kl_penalty"] == approx(10.0)  # -(-30) -> input 20 -> output 10
    assert grad[0, 1].item() == approx(0.1 * 10.0)  # clamped: only the score-function term k * d lp survives
    _, metrics, _ = kl_row("k1", -30.0, kl_input_clamp_value=None, kl_output_clamp_value=None)
    assert metrics["kl_penalty"] == approx(30.0)


def test_on_policy_kl_approximation_weights_by_pi_over_pi_gen() -> None:
    base = ClippedPGLoss(**{**IS, "reference_policy_kl_penalty": 0.1, "reference_policy_kl_type": "k1"})
    loss_fn = dataclasses.replace(base, use_on_policy_kl_approximation=True)
    loss, metrics, grad = run(
        loss_fn, lp=[[0.0, -1.0]], gen=[[0.0, -1.0 - LN2]], ref=[[0.0, -1.5]], adv=[[0.0, 0.0]], mask=[[0, 1]]
    )
    assert metrics["kl_penalty"] == approx(1.0)  # weight exp(lp - gen) = 2; k1 = 0.5; 2 * 0.5
    assert loss == approx(0.1)
    assert grad[0, 1].item() == approx(0.1 * 2 * 1.0)  # detached weight: beta * 2 * d k1 / d lp


def test_sequence_level_kl_reduction() -> None:
    batch = {
        "lp": TWO_ROWS["lp"],
        "ref": [[0.0, -1.5, 0.0, 0.0], [0.0, -2.0, -2.0, -2.0]],  # ref - lp = -0.5 on row 0, -1 on row 1
        "adv": [[0.0] * 4] * 2,
        "mask": TWO_ROWS["mask"],
    }
    config = {**PLAIN, "reference_policy_kl_penalty": 0.1, "reference_policy_kl_type": "k1"}
    _, token, _ = run(ClippedPGLoss(**config), **batch)
    assert token["kl_penalty"] == approx((0.5 + 3 * 1.0) / 4)  # k1 = [0.5], [1, 1, 1] over 4 tokens = 0.875
    _, seq, _ = run(ClippedPGLoss(**config, token_level_loss=False), **batch)
    assert seq["kl_penalty"] == approx((0.5 + 1.0) / 2)  # row means 0.5 and 1 over 2 sequences = 0.75


def test_beta_zero_needs_no_reference_and_beta_positive_does() -> None:
    _, metrics, _ = run(ClippedPGLoss(**PLAIN), lp=[[0.0, -1.0]], adv=[[0.0, 1.0]], mask=[[0, 1]])
    assert metrics["kl_penalty"] == 0.0
    with pytest.raises(ValueError, match="reference_logprobs"):
        run(ClippedPGLoss(reference_policy_kl_penalty=0.1), lp=[[0.0, -1.0]], adv=[[0.0, 1.0]], mask=[[0, 1]])


# ---------------------------------------------------------------- metrics and config


def test_advantage_abs_max_reads_valid_tokens_only() -> None:
    # column 0 (9.0) and the padding of row 1 (-7.0) are not trained: the largest |A| is row 0's -3
    adv, mask = [[9.0, 1.0, -3.0], [0.0, 2.0, -7.0]], [[0, 1, 1], [0, 1, 0]]
    _, m, _ = run(ClippedPGLoss(reference_policy_kl_penalty=0.0), lp=[[0.0] * 3] * 2, adv=adv, mask=mask)
    assert m["advantage_abs_max"] == approx(3.0)


def test_metrics_by_hand() -> None:
    # 3 valid tokens: row 0 tokens 1, 2; row 1 token 1 (token 2 is padding)
    # log(pi/pi_old)   = [0.2, 0], [0]          -> r = [1.2214, 1, 1]
    # log(pi_old/pi_gen) = [0, ln 2], [-ln 2]   -> w = [1, 2, 0.5]
    loss, m, _ = run(
        ClippedPGLoss(**IS),
        lp=[[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]],
        prev=[[0.0, -1.2, -2.0], [0.0, -0.5, 0.0]],
        gen=[[0.0, -1.2, -2.0 - LN2], [0.0, -0.5 + LN2, 0.0]],
        adv=[[0.0, 1.0, 1.0], [0.0, -1.0, 0.0]],
        mask=[[0, 1, 1], [0, 1, 0]],
    )
    r = math.exp(0.2)
    assert m["probs_ratio"] == approx((r + 2) / 3)  # (1.2214 + 1 + 1) / 3 = 1.0738
    assert m["probs_ratio_clamped"] == approx((1.2 + 2) / 3)  # 1.2214 -> 1.2
    assert (m["probs_ratio_min"], m["probs_ratio_max"]) == (approx(1.0), approx(r))
    assert (m["probs_ratio_clamped_min"], m["probs_ratio_clamped_max"]) == (approx(1.0), approx(1.2))
    assert m["token_mult_prob_error"] == approx((1 + 2 + 2) / 3)  # exp|log w| = [1, 2, 2]
    assert m["gen_kl_error"] == approx(0.5 / 3)  # w - 1 - ln w = [0, 2 - 1 - ln 2, 0.5 - 1 + ln 2] sums to 0.5
    # pi/pi_gen = [e^0.2, 2, 0.5], lp = [-1, -2, -0.5]: -(-1.2214 - 4 - 0.25) / 3 = 1.8238
    assert m["approx_entropy"] == approx((r + 4 + 0.25) / 3)
    assert m["sampling_importance_ratio"] == approx((1 + 2 + 0.5) / 3)
    assert m["is_oob_ratio"] == 0.0 and m["num_valid_samples"] == 2.0 and m["kl_penalty"] == 0.0
    # token losses: max(-1.2214, -1.2) = -1.2 (w 1); -1 (w 2) = -2; A = -1, r = 1 -> 1 (w 0.5) = 0.5
    assert loss == approx((-1.2 - 2 + 0.5) / 3) and m["loss"] == loss  # -2.7 / 3 = -0.9


def test_from_config_takes_every_loss_knob() -> None:
    config = LossConfig(
        ratio_clip_c=3.0, truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0
    )
    loss_fn = ClippedPGLoss.from_config(config)
    assert loss_fn.ratio_clip_c == 3.0 and loss_fn.truncated_importance_sampling_ratio == 2.0
    assert ClippedPGLoss.from_config(LossConfig()) == ClippedPGLoss()  # same defaults as the config section


# ---------------------------------------------------------------- value loss


def test_clipped_value_loss() -> None:
    values = torch.tensor([[0.0, 1.5, 1.1]], dtype=torch.float64, requires_grad=True)
    loss, metrics = clipped_value_loss(
        values,
        old_values=torch.tensor([[9.0, 1.0, 1.0]], dtype=torch.float64),
        returns=torch.tensor([[9.0, 2.0, 2.0]], dtype=torch.float64),
        mask=torch.tensor([[0, 1, 1]]),
        clip_epsilon=0.2,
        num_valid_tokens=2,
    )
    loss.backward()
    # token 1: V = 1.5, clip to 1 + 0.2 = 1.2; max((1.5-2)^2 = 0.25, (1.2-2)^2 = 0.64) = 0.64 (clipped, no grad)
    # token 2: V = 1.1 inside the clip; (1.1-2)^2 = 0.81; grad 0.5 * 2 * (1.1 - 2) / 2 tokens = -0.45
    assert loss.item() == approx(0.5 * (0.64 + 0.81) / 2)
    assert values.grad.tolist() == [[0.0, 0.0, approx(-0.45)]]
    assert metrics["vf_clipfrac"].item() == approx(0.5)  # 1 of 2 tokens
    assert metrics["values_mean"].item() == approx(1.3) and metrics["returns_mean"].item() == approx(2.0)
    unclipped, _ = clipped_value_loss(
        values, old_values=values.detach(), returns=torch.full((1, 3), 2.0), mask=torch.tensor([[0, 1, 1]]),
        clip_epsilon=None, coef=2.0, num_valid_tokens=2,
    )  # fmt: skip
    assert unclipped.item() == approx(2.0 * 0.5 * (0.25 + 0.81) / 2)  # coef 2, no clipping
