"""The chunking contract: a step split into micro-batches (same global normalisers) sums to the one-batch values."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.algorithms import METRIC_REDUCTIONS, ClippedPGLoss, valid_counts

CONFIGS = st.fixed_dictionaries(
    {
        "token_level_loss": st.booleans(),
        "sequence_level_importance_ratios": st.booleans(),
        "force_on_policy_ratio": st.booleans(),
        "use_importance_sampling_correction": st.booleans(),
        "truncated_importance_sampling_type": st.sampled_from([None, "tis", "icepop", "seq-mask-tis"]),
        "reference_policy_kl_penalty": st.sampled_from([0.0, 0.1]),
        "reference_policy_kl_type": st.sampled_from(["k1", "k2", "k3"]),
        "use_on_policy_kl_approximation": st.booleans(),
        "ratio_clip_c": st.sampled_from([None, 3.0]),
    }
)


def make_loss(config: dict) -> ClippedPGLoss:
    """The loss of ``config``, its truncation made coherent (the combinations the config validation refuses, off)."""
    kind = config["truncated_importance_sampling_type"]
    seq_mask_on_seq_ratios = kind == "seq-mask-tis" and config["sequence_level_importance_ratios"]
    if kind is None or not config["use_importance_sampling_correction"] or seq_mask_on_seq_ratios:
        config = {**config, "truncated_importance_sampling_type": None}
    else:
        config = {**config, "truncated_importance_sampling_ratio": 1.5, "truncated_importance_sampling_ratio_min": 0.7}
    return ClippedPGLoss(**config)


def make_batch(b: int, t: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lp = -3 * torch.rand(b, t, generator=g, dtype=torch.float64)
    prev = lp + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)
    return {
        "logprobs": lp,
        "prev_logprobs": prev,
        "generation_logprobs": prev + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64),
        "reference_logprobs": lp + 0.5 * torch.randn(b, t, generator=g, dtype=torch.float64),
        "advantages": torch.randn(b, t, generator=g, dtype=torch.float64),
        "mask": (torch.rand(b, t, generator=g) < 0.7).to(torch.int8),
    }


def loss_and_grad(loss_fn: ClippedPGLoss, batch: dict, cuts: list[int]) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Summed loss, gradient and combined metrics over the micro-batches rows[cuts[i]:cuts[i+1]]."""
    tokens, seqs = valid_counts(batch["mask"])  # the step's global counts, shared by every micro-batch
    lp = batch["logprobs"].clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    combined: dict[str, torch.Tensor] = {}
    for start, stop in zip(cuts[:-1], cuts[1:], strict=True):
        rows = {k: v[start:stop] for k, v in batch.items() if k != "logprobs"}
        loss, metrics = loss_fn(lp[start:stop], num_valid_tokens=tokens, num_valid_seqs=seqs, **rows)
        loss.backward()
        total = total + loss.detach()
        for name, value in metrics.items():
            how = METRIC_REDUCTIONS[name]
            prev = combined.get(name)
            if prev is None:
                combined[name] = value
            elif how == "sum":
                combined[name] = prev + value
            else:
                combined[name] = torch.minimum(prev, value) if how == "min" else torch.maximum(prev, value)
    return total, lp.grad, combined


@settings(max_examples=150, deadline=None)
@given(
    config=CONFIGS,
    b=st.integers(1, 6),
    t=st.integers(2, 8),
    seed=st.integers(0, 2**16),
    cut_data=st.data(),
)
def test_micro_batches_sum_to_the_whole_batch(config: dict, b: int, t: int, seed: int, cut_data: st.DataObject) -> None:
    loss_fn = make_loss(config)
    batch = make_batch(b, t, seed)
    inner = cut_data.draw(st.lists(st.integers(1, b - 1), unique=True) if b > 1 else st.just([]))
    cuts = [0, *sorted(inner), b]
    whole_loss, whole_grad, whole_metrics = loss_and_grad(loss_fn, batch, [0, b])
    split_loss, split_grad, split_metrics = loss_and_grad(loss_fn, batch, cuts)
    torch.testing.assert_close(split_loss, whole_loss, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(split_grad, whole_grad, rtol=1e-9, atol=1e-12)
    assert set(whole_metrics) <= set(METRIC_REDUCTIONS)
    for name, value in whole_metrics.items():
        torch.testing.assert_close(split_metrics[name], value, rtol=1e-9, atol=1e-12, msg=name)


def test_half_precision_logprobs_are_upcast_and_keep_their_gradient() -> None:
    batch = make_batch(3, 5, seed=0)
    lp = batch.pop("logprobs").to(torch.bfloat16).requires_grad_(True)
    half = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
    tokens, seqs = valid_counts(batch["mask"])
    loss, metrics = ClippedPGLoss()(lp, num_valid_tokens=tokens, num_valid_seqs=seqs, **half)
    loss.backward()
    assert loss.dtype == torch.float32 and metrics["probs_ratio"].dtype == torch.float32
    assert lp.grad is not None and lp.grad.dtype == torch.bfloat16 and torch.isfinite(lp.grad).all()
