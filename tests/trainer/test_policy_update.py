"""One RL step = one optimizer step, however it is chunked: 1 chunk vs 4 chunks give the same update."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.models.logprobs import token_logprobs
from sc_lightning.trainer.chunks import TrainChunk
from sc_lightning.trainer.policy_update import EmptyStepError, PolicyUpdate
from tests.helpers.train_rows import fresh, run_step, step_rows


@pytest.mark.parametrize("token_level", [True, False])
def test_one_chunk_or_four_give_the_same_update(token_level: bool) -> None:
    rows = step_rows(1)
    whole, split, initial = fresh(), fresh(), fresh()
    one = run_step(whole, [rows], micro_batch_size=16, token_level=token_level)
    four = run_step(
        split, [rows.rows(slice(i, i + 4)) for i in range(0, 16, 4)], micro_batch_size=3, token_level=token_level
    )
    assert one["grad_norm"] == pytest.approx(four["grad_norm"], rel=1e-5)
    assert one["loss"] == pytest.approx(four["loss"], rel=1e-5, abs=1e-7)
    assert one["probs_ratio"] == pytest.approx(1.0) and four["probs_ratio"] == pytest.approx(1.0)
    assert one["global_valid_toks"] == four["global_valid_toks"] == float((rows.token_mask[:, 1:] > 0).sum())
    for a, b in zip(whole.parameters(), split.parameters(), strict=True):
        # summation order only (micro-batches run longest rows first); AdamW's m / sqrt(v) turns order noise on a
        # near-zero gradient into up to lr-sized moves, so allow 1% of lr (1e-2) absolute
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    changed = any(not torch.equal(a, b) for a, b in zip(whole.parameters(), initial.parameters(), strict=True))
    assert changed, "the optimizer step moved the weights"


def test_micro_batches_run_longest_rows_first_trimmed_and_within_the_token_budget() -> None:
    rows = step_rows(5)  # 5 prompt tokens + 2..7 completion tokens, padded to 12 columns
    rows.sample_mask[3] = 0.0  # a filtered row: nothing to learn from, never run
    needed = [int(torch.nonzero(rows.token_mask[i]).max()) + 1 for i in range(len(rows))]
    model, shapes = fresh(), []
    model.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    budget = run_step(model, [rows], micro_batch_size=16, micro_batch_tokens=24)
    whole = run_step(fresh(), [rows], micro_batch_size=16)
    assert budget["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    assert budget["global_valid_toks"] == whole["global_valid_toks"]
    assert sum(b for b, _ in shapes) == len(rows) - 1  # every row once, except the filtered one
    widths = [t for _, t in shapes]
    assert widths == sorted(widths, reverse=True) and widths[0] == max(needed)
    assert widths[-1] < rows.input_ids.shape[1]  # the short rows run trimmed, not padded to the chunk
    assert all(b * t <= 24 for b, t in shapes)  # the padded-token budget of each micro-batch


def test_rounded_micro_batch_widths_give_the_same_update_in_recurring_shapes() -> None:
    """``micro_batch_width_multiple``: each micro-batch runs at its longest row rounded up (within the chunk), the
    extra columns past every row's last valid token; the update is the unrounded one's."""
    rows = step_rows(5)  # 5 prompt tokens + 2..7 completion tokens, padded to 12 columns
    model, shapes = fresh(), []
    model.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    rounded = run_step(model, [rows], micro_batch_size=3, micro_batch_width_multiple=8)
    plain = run_step(fresh(), [rows], micro_batch_size=3)
    assert rounded["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    assert rounded["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-7)
    assert rounded["global_valid_toks"] == plain["global_valid_toks"]
    assert {t for _, t in shapes} <= {8, rows.input_ids.shape[1]}  # 8, or the chunk's 12 columns for longer rows
    assert 8 in {t for _, t in shapes}


def test_a_fully_filtered_step_is_an_error_naming_the_step_and_groups_not_a_silent_skip() -> None:
    rows = step_rows(2)
    rows.sample_mask = torch.zeros(len(rows))
    expected = r"RL step 7: all 16 completions were filtered out.*groups: g0, g1, g2, g3$"
    with pytest.raises(EmptyStepError, match=expected):
        run_step(fresh(), [rows], micro_batch_size=8, step=7)


def test_masked_rows_contribute_nothing_to_the_update() -> None:
    """A row with sample_mask 0 changes neither the gradient nor the token count, whatever its advantages."""
    rows = step_rows(3)
    rows.sample_mask = torch.ones(len(rows))
    rows.sample_mask[:4] = 0.0  # the first group, flagged by the environment or overlong filtering
    scrambled = TrainChunk(**{**vars(rows), "advantages": rows.advantages.clone()})
    scrambled.advantages[:4] *= -50.0
    plain, perturbed = fresh(), fresh()
    first = run_step(plain, [rows], micro_batch_size=16)
    second = run_step(perturbed, [scrambled], micro_batch_size=16)
    assert first["global_valid_seqs"] == second["global_valid_seqs"] == 12.0
    assert first["grad_norm"] == pytest.approx(second["grad_norm"], rel=1e-6)
    for a, b in zip(plain.parameters(), perturbed.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_steps_must_be_opened_once() -> None:
    model = fresh()
    update = PolicyUpdate(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        ClippedPGLoss(reference_policy_kl_penalty=0.0),
        micro_batch_size=4,
        clip_grad=1.0,
    )
    with pytest.raises(RuntimeError, match="no train step is open"):
        update.train_chunk(step_rows(3))
    update.begin()
    with pytest.raises(RuntimeError, match="already open"):
        update.begin()


def test_a_kl_penalty_needs_a_reference_model() -> None:
    model = fresh()
    with pytest.raises(ValueError, match="needs a reference model"):
        PolicyUpdate(
            model, torch.optim.SGD(model.parameters(), lr=0.0), ClippedPGLoss(), micro_batch_size=4, clip_grad=1.0
        )


def off_by(rows: TrainChunk, offsets: dict[int, float]) -> TrainChunk:
    """``rows`` whose generation logprobs are the fresh policy's own, plus ``offsets[row]`` on each of the row's
    tokens: row r's sequence logprob error is exp(|offsets[r]|), and 1 for a row without an offset."""
    model = fresh().train()
    with torch.no_grad():
        own = token_logprobs(model, rows.input_ids)  # (B, T): what PolicyUpdate's forward computes as pi_old
    shift = torch.zeros(len(rows))
    shift[list(offsets)] = torch.tensor(list(offsets.values()))
    return dataclasses.replace(rows, generation_logprobs=(own + shift[:, None]) * rows.token_mask)


FAR = {1: 2.0, 6: -2.0, 7: 1.5, 12: 2.0}  # errors e^2, e^2, e^1.5 (4.48), e^2: above a threshold of 3
NEAR = {0: 0.5, 2: -0.5}  # errors e^0.5 (1.65): below it; the other 10 rows: 1


def test_rows_above_the_logprob_error_threshold_leave_the_loss_as_if_their_sample_mask_were_0() -> None:
    rows = off_by(step_rows(4), FAR | NEAR)
    rows.rewards = torch.zeros(len(rows))
    rows.rewards[[1, 7, 12]] = 1.0  # 3 of the 4 far rows are correct answers
    by_threshold, by_sample_mask, unmasked = fresh(), fresh(), fresh()
    # micro-batches of 2 rows, grouped by length: the masked rows fall in micro-batches of their own or not
    masked = run_step(by_threshold, [rows], micro_batch_size=2, seq_logprob_error_threshold=3.0)
    filtered = dataclasses.replace(rows, sample_mask=rows.sample_mask.clone())
    filtered.sample_mask[list(FAR)] = 0.0
    reference = run_step(by_sample_mask, [filtered], micro_batch_size=16)
    assert masked["global_valid_seqs"] == reference["global_valid_seqs"] == 12.0
    assert masked["global_valid_toks"] == reference["global_valid_toks"]  # the normaliser counts kept tokens only
    assert masked["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
    assert masked["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-7)
    for a, b in zip(by_threshold.parameters(), by_sample_mask.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-8)  # the normalised, clipped gradients
    logged_only = run_step(unmasked, [rows], micro_batch_size=16)  # no threshold: the far rows train
    assert logged_only["global_valid_seqs"] == 16.0
    assert logged_only["grad_norm"] != pytest.approx(masked["grad_norm"], rel=1e-3)


def test_the_step_metrics_of_the_logprob_error_are_exact_over_micro_batches() -> None:
    rows = off_by(step_rows(4), FAR | NEAR)
    rows.rewards = torch.zeros(len(rows))
    rows.rewards[[1, 7, 12]] = 1.0
    e = math.exp
    expected = {
        "max_seq_mult_prob_error": e(2.0),
        "min_seq_mult_prob_error": 1.0,
        "mean_seq_mult_prob_error": (3 * e(2.0) + e(1.5) + 2 * e(0.5) + 10 * 1.0) / 16,
        "max_seq_mult_prob_error_after_mask": e(0.5),
        "min_seq_mult_prob_error_after_mask": 1.0,
        "mean_seq_mult_prob_error_after_mask": (2 * e(0.5) + 10 * 1.0) / 12,
        "num_masked_seqs_by_logprob_error": 4.0,
        "masked_correct_pct": 3 / 4,
    }
    for micro_batch_size in (16, 3, 2):  # masked and kept rows meet in different micro-batches at each size
        metrics = run_step(fresh(), [rows], micro_batch_size=micro_batch_size, seq_logprob_error_threshold=3.0)
        assert {k: metrics[k] for k in expected} == pytest.approx(expected, rel=1e-5)
    metrics = run_step(fresh(), [rows], micro_batch_size=3)  # null: the same errors, nothing masked
    assert metrics["num_masked_seqs_by_logprob_error"] == 0.0 and metrics["masked_correct_pct"] == 0.0
    assert metrics["mean_seq_mult_prob_error"] == pytest.approx(expected["mean_seq_mult_prob_error"], rel=1e-5)
    assert metrics["mean_seq_mult_prob_error_after_mask"] == metrics["mean_seq_mult_prob_error"]
    assert metrics["max_seq_mult_prob_error_after_mask"] == metrics["max_seq_mult_prob_error"]


def test_rows_without_valid_tokens_are_not_counted_by_the_logprob_error() -> None:
    rows = off_by(step_rows(4), FAR)
    rows.sample_mask[[1, 6]] = 0.0  # two of the far rows were filtered before (overlong, environment)
    metrics = run_step(fresh(), [rows], micro_batch_size=5, seq_logprob_error_threshold=3.0)
    assert metrics["num_masked_seqs_by_logprob_error"] == 2.0  # rows 7 and 12
    assert metrics["mean_seq_mult_prob_error"] == pytest.approx((math.exp(1.5) + math.exp(2.0) + 12 * 1.0) / 14)
    assert metrics["max_seq_mult_prob_error"] == pytest.approx(math.exp(2.0))
    assert metrics["global_valid_seqs"] == 12.0  # 16 rows - 2 filtered - 2 masked


def test_a_step_the_threshold_masks_entirely_is_an_error_naming_the_knob() -> None:
    rows = step_rows(2)
    rows.sample_mask[:4] = 0.0  # the first group was filtered anyway: 12 sequences left to check
    expected = (
        r"^RL step 5: all 16 completions were filtered out, nothing to train on: "
        r"grpo\.seq_logprob_error_threshold=0\.5 masked 12 of 12 sequences .*"
        r"raise grpo\.seq_logprob_error_threshold, or set it to null .*groups: g0, g1, g2, g3$"
    )
    with pytest.raises(EmptyStepError, match=expected):
        run_step(fresh(), [rows], micro_batch_size=5, step=5, seq_logprob_error_threshold=0.5)  # every error is >= 1


def test_max_token_staleness_trains_as_if_the_old_tokens_were_not_there() -> None:
    """Each row's first two completion tokens come from weights 2 (sampled before a refit), the rest from 5: at
    trainer version 5 with ``max_token_staleness=2`` the step equals one whose mask leaves those tokens out."""
    rows = step_rows(3)
    versions = torch.full_like(rows.input_ids, 5)
    old = (rows.token_mask > 0) & (rows.token_mask.cumsum(-1) <= 2)
    versions[old] = 2
    rows.token_versions = versions
    masked = run_step(fresh(), [rows], micro_batch_size=5, version=5, max_token_staleness=2)
    by_hand = TrainChunk(**{**vars(rows), "token_mask": rows.token_mask * ~old, "token_versions": None})
    expected = run_step(fresh(), [by_hand], micro_batch_size=5, version=5)
    fresh_tokens = float((rows.token_mask > 0).sum() - old.sum())
    assert masked["global_valid_toks"] == expected["global_valid_toks"] == fresh_tokens
    assert masked["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    assert masked["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert (masked["token_staleness_mean"], masked["token_staleness_max"]) == (0.0, 0.0)
    measured = run_step(fresh(), [rows], micro_batch_size=5, version=5)  # no bound: measured, not masked
    assert measured["token_staleness_max"] == 3.0
    assert measured["token_staleness_mean"] == pytest.approx(3.0 * old.sum().item() / measured["global_valid_toks"])
    assert "token_staleness_mean" not in expected  # a chunk without token versions is not measured
