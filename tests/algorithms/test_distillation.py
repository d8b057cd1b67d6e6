"""On-policy distillation math with hand-computed values: sampled-token advantages (with the reward mix), the exact
full-vocabulary reverse KL, and the per-teacher KL sums."""

from __future__ import annotations

import math

import pytest
import torch

from sc_lightning.algorithms import (
    ClippedPGLoss,
    expand_to_tokens,
    full_vocabulary_reverse_kl,
    grpo_advantages,
    opd_advantages,
    teacher_kl_sums,
)

# Two rows of 5 tokens: row 0 is a prompt token, then 3 model tokens and padding; row 1 is a multi-turn row whose
# token 3 is the environment's (mask 0).
MASK = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 0, 1]], dtype=torch.float32)
TEACHER = torch.tensor([[0.0, -0.1, -2.0, -0.5, 0.0], [0.0, -1.0, -0.2, -9.0, -0.3]])
GEN = torch.tensor([[0.0, -0.6, -0.5, -0.5, 0.0], [0.0, -0.2, -1.2, -4.0, -0.3]])


def test_sampled_token_advantage_is_the_teacher_gap_on_model_tokens_only() -> None:
    adv = opd_advantages(TEACHER, GEN, MASK)
    # by hand: teacher - gen where the mask is 1; the environment token (-9 - -4) and the prompt token stay 0
    expected = torch.tensor([[0.0, 0.5, -1.5, 0.0, 0.0], [0.0, -0.8, 1.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_reward_weight_mixes_the_grpo_advantage_in() -> None:
    rewards = torch.tensor([[1.0, 0.0]])  # one group of the two rows
    per_row = grpo_advantages(rewards, leave_one_out=False, normalize=False).squeeze(0)  # mean 0.5: (+0.5, -0.5)
    adv = opd_advantages(TEACHER, GEN, MASK, reward_advantages=expand_to_tokens(per_row, MASK), reward_weight=0.2)
    # by hand: gap + 0.2 x (+0.5) on row 0, gap + 0.2 x (-0.5) on row 1
    expected = torch.tensor([[0.0, 0.6, -1.4, 0.1, 0.0], [0.0, -0.9, 0.9, 0.0, -0.1]])
    torch.testing.assert_close(adv, expected)


def test_reward_weight_without_reward_advantages_is_refused() -> None:
    with pytest.raises(ValueError, match="needs the reward advantages"):
        opd_advantages(TEACHER, GEN, MASK, reward_weight=0.5)


def test_the_advantage_never_carries_gradient() -> None:
    teacher = TEACHER.clone().requires_grad_()
    assert not opd_advantages(teacher, GEN, MASK).requires_grad


def test_on_policy_the_loss_gradient_is_the_reverse_kl_gradient() -> None:
    """With pi_gen = pi_old = pi_theta (ratio 1) the policy-gradient loss with the OPD advantage has the gradient of
    the sampled-token reverse KL, sum_t (log pi_theta - log pi_teacher) * grad log pi_theta, divided by the tokens."""
    logprobs = GEN.clone().requires_grad_()
    adv = opd_advantages(TEACHER, GEN, MASK)
    loss_fn = ClippedPGLoss(reference_policy_kl_penalty=0.0, use_importance_sampling_correction=True)
    loss, _ = loss_fn(
        logprobs,
        prev_logprobs=GEN,
        generation_logprobs=GEN,
        advantages=adv,
        mask=MASK,
        num_valid_tokens=5.0,
        num_valid_seqs=2.0,
    )
    loss.backward()
    expected = -adv / 5.0  # d(-A * ratio)/d logp = -A at ratio 1
    torch.testing.assert_close(logprobs.grad, expected)


def test_full_vocabulary_reverse_kl_by_hand() -> None:
    student = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))  # (1, 2, 2)
    teacher = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]]))
    kl = full_vocabulary_reverse_kl(student, teacher, torch.tensor([[1.0, 1.0]]))
    # position 0: 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75); position 1: the same distribution, 0
    by_hand = 0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0)
    torch.testing.assert_close(kl, torch.tensor([[by_hand, 0.0]]))


def test_full_vocabulary_reverse_kl_masks_and_differentiates_the_student_only() -> None:
    logits = torch.tensor([[[1.0, 0.0, -1.0], [0.0, 0.0, 0.0]]], requires_grad=True)
    student = torch.log_softmax(logits, -1)
    teacher = torch.log_softmax(torch.tensor([[[0.0, 2.0, 0.0], [5.0, 0.0, 0.0]]]), -1)
    kl = full_vocabulary_reverse_kl(student, teacher, torch.tensor([[1.0, 0.0]]))
    assert kl[0, 1] == 0.0  # masked
    kl.sum().backward()
    assert logits.grad[0, 1].abs().sum() == 0.0  # no gradient from a masked position
    # the gradient of KL(p_s || p_t) in the logits is p_s * (log p_s - log p_t - KL): by hand from the same numbers
    p = student.detach().exp()[0, 0]
    gap = student.detach()[0, 0] - teacher[0, 0]
    torch.testing.assert_close(logits.grad[0, 0], p * (gap - (p * gap).sum()))


def test_teacher_kl_sums_split_by_teacher() -> None:
    kl, tokens = teacher_kl_sums(TEACHER, GEN, MASK, torch.tensor([1, 0]), 2)
    # row 1 (teacher 0): (-0.2 - -1) + (-1.2 - -0.2) + (-0.3 - -0.3) = -0.2 over 3 tokens
    # row 0 (teacher 1): (-0.6 - -0.1) + (-0.5 - -2.0) + 0 = 1.0 over 3 tokens
    torch.testing.assert_close(kl, torch.tensor([-0.2, 1.0]))
    torch.testing.assert_close(tokens, torch.tensor([3.0, 3.0]))


def test_teacher_kl_sums_skip_rows_without_a_teacher() -> None:
    kl, tokens = teacher_kl_sums(TEACHER, GEN, MASK, torch.tensor([-1, 0]), 1)
    torch.testing.assert_close(kl, torch.tensor([-0.2]))
    torch.testing.assert_close(tokens, torch.tensor([3.0]))
