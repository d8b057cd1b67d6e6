"""One RL step = one optimizer step, however it is chunked: 1 chunk vs 4 chunks give the same update."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.lightning.policy_update import EmptyStepError, PolicyUpdate
from sc_lightning.lightning.step_data import TrainChunk
from sc_lightning.models import build_gpt_model, builtin_spec

SPEC = builtin_spec("builtin:tiny")


def step_rows(seed: int, groups: int = 4, gens: int = 4, length: int = 12) -> TrainChunk:
    """Random rows of ``groups`` complete groups: 5 prompt tokens, then a completion of random length."""
    g = torch.Generator().manual_seed(seed)
    rows = groups * gens
    input_ids = torch.randint(3, SPEC.vocab_size, (rows, length), generator=g)
    completion = torch.randint(2, length - 5 + 1, (rows,), generator=g)
    positions = torch.arange(length)
    token_mask = ((positions >= 5) & (positions < 5 + completion[:, None])).float()
    return TrainChunk(
        input_ids=input_ids,
        token_mask=token_mask,
        generation_logprobs=-torch.rand(rows, length, generator=g) * token_mask,
        sample_mask=torch.ones(rows),
        advantages=torch.randn(rows, 1, generator=g).expand(rows, length) * token_mask,
        rewards=torch.rand(rows, generator=g),
        group_ids=[f"g{i // gens}" for i in range(rows)],
        start_weights=[0] * rows,
    )


def run_step(model, chunks: list[TrainChunk], *, micro_batch_size: int, token_level: bool = True, step: int = 0):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn = ClippedPGLoss(token_level_loss=token_level, reference_policy_kl_penalty=0.0)
    update = PolicyUpdate(model, optimizer, loss_fn, micro_batch_size=micro_batch_size, clip_grad=1.0)
    update.begin(step=step)
    for chunk in chunks:
        update.train_chunk(chunk)
    return update.finish()


def fresh():
    """The same seeded tiny policy every time (megatron models hold process groups, so they do not deepcopy)."""
    return build_gpt_model(SPEC, precision="fp32", seed=0)


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
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # summation order only
    changed = any(not torch.equal(a, b) for a, b in zip(whole.parameters(), initial.parameters(), strict=True))
    assert changed, "the optimizer step moved the weights"


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
