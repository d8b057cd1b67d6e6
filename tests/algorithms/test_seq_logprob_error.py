"""The sequence-level logprob error, its threshold mask and its metrics, against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch
from pytest import approx

from sc_lightning.algorithms import (
    METRIC_REDUCTIONS,
    loss_mask,
    seq_logprob_error_mask,
    seq_logprob_error_metrics,
    seq_mult_prob_error,
)


def hand_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4 rows x 4 tokens: (generation logprobs, trainer logprobs, loss mask); gen - prev is written per token.

    Row 0: tokens 1, 2 valid, |gen - prev| = 0.1, 0.3 (column 0 differs by 3.0 but is never a training token)
    Row 1: tokens 1, 2, 3 valid, |gen - prev| = 0.0, 0.5, 0.2 (the 0.5 is gen below prev)
    Row 2: token 2 valid, |gen - prev| = 1.0
    Row 3: sample_mask 0, so no valid token, whatever its (large) differences
    """
    prev = torch.tensor(
        [
            [-1.0, -2.0, -0.5, -1.0],
            [-1.0, -0.7, -1.0, -2.0],
            [-1.0, -1.0, -3.0, -1.0],
            [-1.0, -1.0, -1.0, -1.0],
        ]
    )
    diff = torch.tensor(
        [
            [3.0, 0.1, 0.3, 9.0],  # column 3 is padding (token_mask 0)
            [0.0, 0.0, -0.5, 0.2],
            [0.0, 0.0, 1.0, 0.0],
            [5.0, 5.0, 5.0, 5.0],
        ]
    )
    token_mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 0], [1, 1, 1, 1]], dtype=torch.float32)
    sample_mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    return prev + diff, prev, loss_mask(token_mask, sample_mask)


ROW0 = (math.exp(0.1) + math.exp(0.3)) / 2  # 1.2275
ROW1 = (math.exp(0.0) + math.exp(0.5) + math.exp(0.2)) / 3  # 1.2900
ROW2 = math.exp(1.0)  # 2.7183


def test_the_per_sequence_error_is_the_mean_over_valid_tokens_of_exp_abs_difference() -> None:
    gen, prev, mask = hand_case()
    errors = seq_mult_prob_error(gen, prev, mask)
    assert errors[:3].tolist() == approx([ROW0, ROW1, ROW2], rel=1e-6)
    assert math.isnan(errors[3])  # no valid token: no error, left out of every statistic


def test_a_threshold_between_the_errors_masks_exactly_the_rows_above_it() -> None:
    gen, prev, mask = hand_case()
    errors = seq_mult_prob_error(gen, prev, mask)
    assert seq_logprob_error_mask(errors, 1.25).tolist() == [False, True, True, False]  # ROW0 < 1.25 < ROW1
    assert seq_logprob_error_mask(errors, 2.0).tolist() == [False, False, True, False]
    assert seq_logprob_error_mask(errors, 0.5).tolist() == [True, True, True, False]  # every error is >= 1
    assert seq_logprob_error_mask(errors, None).tolist() == [False] * 4  # null: metrics only
    assert seq_logprob_error_mask(errors, ROW2 + 1e-3).tolist() == [False] * 4


def test_the_metrics_before_and_after_the_mask() -> None:
    gen, prev, mask = hand_case()
    errors = seq_mult_prob_error(gen, prev, mask)
    masked = seq_logprob_error_mask(errors, 1.25)  # rows 1 and 2
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])  # of the masked rows, row 1 is correct
    m = {k: float(v) for k, v in seq_logprob_error_metrics(errors, masked, rewards).items()}
    assert m == approx(
        {
            "max_seq_mult_prob_error": ROW2,
            "min_seq_mult_prob_error": ROW0,
            "mean_seq_mult_prob_error": ROW0 + ROW1 + ROW2,  # raw sum; the step divides by its 3 valid rows
            "max_seq_mult_prob_error_after_mask": ROW0,
            "min_seq_mult_prob_error_after_mask": ROW0,
            "mean_seq_mult_prob_error_after_mask": ROW0,  # raw sum over the 1 kept row
            "num_masked_seqs_by_logprob_error": 2.0,
            "masked_correct_pct": 1.0,  # raw count; the step divides by the 2 masked rows: 0.5
        },
        rel=1e-6,
    )
    assert set(m) <= set(METRIC_REDUCTIONS)


def test_a_micro_batch_without_a_kept_row_reports_neutral_extremes() -> None:
    gen, prev, mask = hand_case()
    errors = seq_mult_prob_error(gen, prev, mask)[2:]  # row 2 (masked below) and row 3 (no valid token)
    m = seq_logprob_error_metrics(errors, seq_logprob_error_mask(errors, 1.25), torch.tensor([0.0, 1.0]))
    assert m["max_seq_mult_prob_error_after_mask"] == -math.inf  # the step's max over micro-batches ignores it
    assert m["min_seq_mult_prob_error_after_mask"] == math.inf
    assert m["mean_seq_mult_prob_error_after_mask"] == 0.0 and m["masked_correct_pct"] == 0.0


@pytest.mark.parametrize("gen_value", [-math.inf, math.nan])
def test_a_non_finite_generation_logprob_is_an_infinite_error(gen_value: float) -> None:
    prev = torch.tensor([[-1.0, -1.0, -1.0]])
    gen = torch.tensor([[-1.0, -1.0, gen_value]])
    errors = seq_mult_prob_error(gen, prev, torch.ones(1, 3))
    assert errors.tolist() == [math.inf]
    assert seq_logprob_error_mask(errors, 100.0).tolist() == [True]


def test_half_precision_inputs_are_upcast() -> None:
    gen, prev, mask = hand_case()
    errors = seq_mult_prob_error(gen.to(torch.bfloat16), prev.to(torch.bfloat16), mask)
    assert errors.dtype == torch.float32
    assert errors[:3].tolist() == approx([ROW0, ROW1, ROW2], rel=2e-2)  # bf16 rounds the inputs, not the exp
