"""Sampling primitives: top-k / top-p filter invariants (hypothesis), seeded draws, the logprob convention."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.engines.sampling import filter_logits, sample_tokens, scoring_temperature

NEG_INF = float("-inf")

FLOATS = st.floats(min_value=-20, max_value=20, allow_nan=False, width=32)
logit_rows = st.lists(st.floats(min_value=-20, max_value=20, allow_nan=False, width=32), min_size=1, max_size=40).map(
    lambda xs: torch.tensor(xs, dtype=torch.float32)
)


def kept(row: torch.Tensor) -> torch.Tensor:
    """Bool mask of the entries a filter left finite."""
    return row > NEG_INF


@settings(max_examples=200, deadline=None)
@given(row=logit_rows, k=st.integers(min_value=0, max_value=50))
def test_top_k_keeps_exactly_the_k_largest(row: torch.Tensor, k: int) -> None:
    out = filter_logits(row[None], top_k=torch.tensor([k]))[0]
    mask = kept(out)
    expected = len(row) if k <= 0 else min(k, len(row))
    assert int(mask.sum()) == expected
    assert torch.equal(out[mask], row[mask])  # survivors unchanged
    if not mask.all():
        assert row[mask].min() >= row[~mask].max()  # nothing dropped beats anything kept


@settings(max_examples=200, deadline=None)
@given(row=logit_rows, p=st.floats(min_value=1e-3, max_value=1.0))
def test_top_p_keeps_the_smallest_prefix_reaching_p(row: torch.Tensor, p: float) -> None:
    out = filter_logits(row[None], top_p=torch.tensor([p]))[0]
    mask = kept(out)
    probs = row.softmax(-1)
    assert mask[row.argmax()]  # the most likely token always survives
    assert torch.equal(out[mask], row[mask])
    if p >= 1.0:
        assert mask.all()
        return
    if not mask.all():
        assert probs[mask].min() >= probs[~mask].max()  # a most-likely set
        assert float(probs[mask].sum()) >= p - 1e-5  # it reaches p ...
        smallest = probs[mask].min()
        assert float(probs[mask].sum() - smallest) < p + 1e-5  # ... and is minimal


@settings(max_examples=150, deadline=None)
@given(row=logit_rows, k=st.integers(min_value=1, max_value=10), p=st.floats(min_value=1e-3, max_value=1.0))
def test_top_p_applies_to_the_renormalised_top_k_survivors(row: torch.Tensor, k: int, p: float) -> None:
    both = kept(filter_logits(row[None], top_k=torch.tensor([k]), top_p=torch.tensor([p]))[0])
    only_k = kept(filter_logits(row[None], top_k=torch.tensor([k]))[0])
    assert not (both & ~only_k).any()
    renormalised = row.masked_fill(~only_k, NEG_INF)
    assert torch.equal(both, kept(filter_logits(renormalised[None], top_p=torch.tensor([p]))[0]))


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.lists(FLOATS, min_size=12, max_size=12), min_size=1, max_size=6), seed=st.integers(0, 2**31))
def test_samples_stay_inside_the_filtered_set_and_report_the_scaled_logprob(rows: list, seed: int) -> None:
    logits = torch.tensor(rows)
    batch = len(rows)
    temperature = torch.linspace(0.3, 1.5, batch)
    top_k = torch.tensor([(i % 4) * 2 for i in range(batch)])  # 0 (off), 2, 4, 6
    top_p = torch.tensor([0.5 + 0.1 * (i % 5) for i in range(batch)])
    generators = [torch.Generator().manual_seed(seed + i) for i in range(batch)]
    tokens, logprobs = sample_tokens(logits, temperature, top_k, top_p, generators)
    allowed = kept(filter_logits(logits / temperature[:, None], top_k, top_p))
    assert allowed.gather(1, tokens[:, None]).all()
    expected = (logits / temperature[:, None]).log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)
    assert torch.allclose(logprobs, expected, atol=1e-6)


def test_greedy_rows_take_the_argmax_and_report_the_unscaled_logprob() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [3.0, 0.0, 0.5, 2.9]])
    tokens, logprobs = sample_tokens(
        logits, torch.tensor([0.0, 0.5]), torch.tensor([0, 1]), torch.tensor([1.0, 1.0]), [None, None]
    )
    assert tokens.tolist() == [1, 0]
    assert logprobs[0] == pytest.approx(float(logits[0].log_softmax(-1)[1]), abs=1e-6)  # T = 0 -> scored at T = 1
    assert logprobs[1] == pytest.approx(float((logits[1] / 0.5).log_softmax(-1)[0]), abs=1e-6)  # top_k = 1 keeps T
    assert scoring_temperature(0.0) == 1.0 and scoring_temperature(0.7) == 0.7


def test_draws_follow_the_distribution_and_depend_only_on_the_row_generator() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]]))
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(4000):
        token, _ = sample_tokens(logits, torch.ones(1), torch.zeros(1), torch.ones(1), [gen])
        counts[token] += 1
    freq = counts / counts.sum()
    assert counts[3] == 0  # probability 0 is never drawn
    assert torch.allclose(freq[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.03)
    other = torch.randn(3, 4)
    alone, _ = sample_tokens(logits, torch.ones(1), torch.zeros(1), torch.ones(1), [torch.Generator().manual_seed(7)])
    batched, _ = sample_tokens(
        torch.cat([other[:1], logits, other[1:]]),
        torch.ones(4),
        torch.zeros(4),
        torch.ones(4),
        [torch.Generator().manual_seed(s) for s in (1, 7, 2, 3)],
    )
    assert batched[1] == alone[0]
