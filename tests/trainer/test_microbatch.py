"""Micro-batch planning: every row with a valid token runs exactly once, within both limits, with little padding."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.trainer.microbatch import needed_widths, plan_microbatches


@given(
    widths=st.lists(st.integers(min_value=0, max_value=64), max_size=40),
    max_rows=st.integers(min_value=1, max_value=9),
    max_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=300)),
    width_multiple=st.sampled_from([1, 8, 64]),
    beyond=st.integers(min_value=0, max_value=70),
)
def test_every_row_with_a_valid_token_runs_once_within_the_limits(
    widths: list[int], max_rows: int, max_tokens: int | None, width_multiple: int, beyond: int
) -> None:
    max_width = max(widths, default=0) + beyond  # the chunk's columns: its longest row's, or more
    plans = plan_microbatches(
        widths, max_rows=max_rows, max_tokens=max_tokens, width_multiple=width_multiple, max_width=max_width
    )
    planned = [i for plan in plans for i in plan.rows]
    assert sorted(planned) == [i for i, width in enumerate(widths) if width > 0]
    lengths = [widths[i] for i in planned]
    assert lengths == sorted(lengths, reverse=True)  # longest first: each micro-batch pads to its first row
    for plan in plans:
        assert plan.lengths == [widths[i] for i in plan.rows]
        rounded = -(-max(plan.lengths) // width_multiple) * width_multiple
        assert plan.width == min(rounded, max_width)  # its longest row's, rounded up within the chunk
        assert 1 <= len(plan.rows) <= max_rows
        if max_tokens is not None and len(plan.rows) > 1:
            assert plan.padded_tokens <= max_tokens


def test_a_token_budget_cuts_by_padded_size_and_a_long_row_runs_alone() -> None:
    plans = plan_microbatches([10, 100, 30, 30, 0, 20], max_rows=8, max_tokens=64)
    assert [(p.rows, p.width) for p in plans] == [([1], 100), ([2, 3], 30), ([5, 0], 20)]
    assert [p.rows for p in plan_microbatches([32, 32], max_rows=8, max_tokens=64)] == [[0, 1]]  # exactly the budget


def test_a_width_multiple_rounds_each_micro_batch_up_and_the_budget_counts_it() -> None:
    """Widths round up to the multiple (so a run's micro-batches recur in a few shapes), never past the chunk's
    columns, and the token budget holds for the rounded width: 3 rows of 40 round to 64, and only 2 fit 128."""
    plans = plan_microbatches([40, 40, 40, 70, 10], max_rows=8, max_tokens=128, width_multiple=64, max_width=100)
    assert [(p.rows, p.width) for p in plans] == [([3], 100), ([0, 1], 64), ([2, 4], 64)]
    assert [p.width for p in plan_microbatches([40, 10], max_rows=1, width_multiple=64, max_width=40)] == [40, 40]


def test_micro_batches_fill_up_to_the_row_limit() -> None:
    """A micro-batch takes rows until it holds max_rows (with no token budget in the way), not fewer."""
    assert [p.rows for p in plan_microbatches([5] * 5, max_rows=2)] == [[0, 1], [2, 3], [4]]


def test_needed_widths_end_at_the_last_valid_token() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 1]], dtype=torch.float32)
    assert needed_widths(mask) == [3, 0, 5]
