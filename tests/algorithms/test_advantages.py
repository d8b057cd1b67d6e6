"""Advantage estimators: hand-computed GRPO cases for every branch, and GAE against a plain per-row loop."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.algorithms import (
    expand_to_tokens,
    gae_advantages,
    grpo_advantages,
    grpo_advantages_by_group,
    terminal_token_rewards,
    whiten,
)

EPS = 1e-6


def close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- GRPO


def test_grpo_group_mean_baseline_without_normalisation() -> None:
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), leave_one_out=False, normalize=False)
    close(adv, [[0.5, -0.5, -0.5, 0.5]])  # mean = 0.5; r - 0.5


def test_grpo_group_mean_baseline_normalised_by_bessel_std() -> None:
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), leave_one_out=False, normalize=True)
    # var = 4 * 0.5^2 / (4 - 1) = 1/3, std = 0.57735; 0.5 / (0.57735 + 1e-6) = 0.86602
    a = 0.5 / (math.sqrt(1 / 3) + EPS)
    close(adv, [[a, -a, -a, a]])


def test_grpo_leave_one_out_baseline_without_normalisation() -> None:
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), leave_one_out=True, normalize=False)
    # i=0: others [0, 0, 0] mean 0 -> 1 - 0 = 1; i>0: others [1, 0, 0] mean 1/3 -> 0 - 1/3
    close(adv, [[1.0, -1 / 3, -1 / 3, -1 / 3]])


def test_grpo_leave_one_out_normalised_by_std_of_the_others() -> None:
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), leave_one_out=True, normalize=True)
    # i=0: others [0, 0, 0] have std 0 -> raw 1
    # i>0: others [1, 0, 0]: mean 1/3, var = ((2/3)^2 + 2 * (1/3)^2) / (3 - 1) = 1/3, std = 0.57735
    #      (-1/3) / (0.57735 + 1e-6) = -0.57735
    b = (-1 / 3) / (math.sqrt(1 / 3) + EPS)
    close(adv, [[1.0, b, b, b]])


def test_grpo_leave_one_out_group_of_two_is_not_normalised() -> None:
    adv = grpo_advantages(torch.tensor([[1.0, 0.0]]), leave_one_out=True, normalize=True)
    close(adv, [[1.0, -1.0]])  # one "other" sample: std undefined -> 0 -> raw 1 - 0, 0 - 1


def test_grpo_group_of_two_without_leave_one_out() -> None:
    adv = grpo_advantages(torch.tensor([[1.0, 0.0]]), leave_one_out=False, normalize=True)
    # mean 0.5, var = 2 * 0.25 / 1 = 0.5, std = 0.70711; 0.5 / 0.70711 = 0.70711
    a = 0.5 / (math.sqrt(0.5) + EPS)
    close(adv, [[a, -a]])


@pytest.mark.parametrize("loo", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_grpo_zero_variance_group_gives_exactly_zero(loo: bool, normalize: bool) -> None:
    # 0.1 is inexact in binary, so a naive baseline leaves ~1e-9 residues that 1 / (std + eps) would inflate.
    rewards = torch.tensor([[0.1, 0.1, 0.1], [1.0, 1.0, 1.0]])
    adv = grpo_advantages(rewards, leave_one_out=loo, normalize=normalize)
    assert torch.equal(adv, torch.zeros(2, 3))


@pytest.mark.parametrize("loo", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_grpo_group_of_one_gives_zero(loo: bool, normalize: bool) -> None:
    adv = grpo_advantages(torch.tensor([[3.0], [-1.0]]), leave_one_out=loo, normalize=normalize)
    assert torch.equal(adv, torch.zeros(2, 1))


def test_grpo_leave_one_out_with_constant_others_keeps_the_raw_difference() -> None:
    adv = grpo_advantages(torch.tensor([[0.1, 0.1, 0.1, 1.0]]), leave_one_out=True, normalize=True)
    # i=3: others [0.1, 0.1, 0.1] std exactly 0 -> raw 1.0 - 0.1 = 0.9 (not 0.9 / 1e-6)
    # i<3: others e.g. [0.1, 0.1, 1.0]: mean 0.4, var = (0.09 + 0.09 + 0.36) / 2 = 0.27, std = 0.51962
    #      (0.1 - 0.4) / 0.51962 = -0.57735
    b = -0.3 / (math.sqrt(0.27) + EPS)
    close(adv, [[b, b, b, 0.9]])


def test_grpo_bounds_of_docs_training_md_for_groups_of_8() -> None:
    # every 0/1 reward pattern: the default estimator stays below 2.3, group mean and std below 2.5
    binary = torch.tensor(list(itertools.product([0.0, 1.0], repeat=8)), dtype=torch.float64)  # (256, 8)
    assert grpo_advantages(binary).abs().max() == pytest.approx(1 / math.sqrt(1 / 7) * 6 / 7, rel=1e-5)  # 2.2678
    assert grpo_advantages(binary, leave_one_out=False).abs().max() < 2.5
    # partial credit: seven nearly equal group-mates make the eighth's advantage huge, unless the std is left out
    partial = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.1]], dtype=torch.float64)
    assert grpo_advantages(partial).abs().max() > 20
    assert grpo_advantages(partial, normalize=False).abs().max() <= 1


def test_grpo_groups_are_independent() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 4.0]])
    adv = grpo_advantages(rewards, leave_one_out=False, normalize=False)
    # means 0.5, 2, 1
    close(adv, [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0], [-1.0, -1.0, -1.0, 3.0]])


def test_grpo_by_group_matches_the_grid_layout_for_ragged_interleaved_groups() -> None:
    rewards = torch.tensor([1.0, 0.0, 5.0, 0.0, 1.0, 7.0])
    ids = ["a", "a", "b", "a", "b", "c"]
    adv = grpo_advantages_by_group(rewards, ids, leave_one_out=True, normalize=True)
    # a = [1, 0, 0]: i=0 others [0, 0] std 0 -> raw 1; i>0 others [1, 0]: mean 0.5, std sqrt(0.5) -> -0.5 / 0.7071
    # b = [5, 1]: a LOO pair, never normalised -> 5 - 1 = 4, 1 - 5 = -4;  c = [7]: group of one -> 0
    a = -0.5 / (math.sqrt(0.5) + EPS)
    close(adv, [1.0, a, 4.0, a, -4.0, 0.0])


def test_expand_to_tokens_is_constant_per_row_and_zero_outside_the_mask() -> None:
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]], dtype=torch.int8)
    close(expand_to_tokens(torch.tensor([2.0, -1.0]), mask), [[0.0, 2.0, 2.0], [0.0, 0.0, -1.0]])


# ---------------------------------------------------------------- GAE


def test_terminal_token_rewards_sit_on_the_last_valid_token() -> None:
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 1], [0, 0, 0, 0]])
    close(terminal_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask), [[0, 0, 2, 0], [0, 0, 0, 3], [0, 0, 0, 0]])


def test_gae_gamma_lambda_one_is_reward_minus_value() -> None:
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[9.0, 1.0, 2.0, 3.0]])
    mask = torch.tensor([[0, 1, 1, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    close(adv, [[0.0, 0.0, -1.0, -2.0]])  # A_t = R - V_t = 1 - 1, 1 - 2, 1 - 3; prompt column 0
    close(ret, [[0.0, 1.0, 1.0, 1.0]])  # R_t = A_t + V_t = 1


def test_gae_discounted_by_hand() -> None:
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[9.0, 1.0, 2.0, 3.0]])
    mask = torch.tensor([[0, 1, 1, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    # t=3: delta = 1 + 0 - 3 = -2;            A = -2
    # t=2: delta = 0 + 0.5*3 - 2 = -0.5;      A = -0.5 + 0.25*(-2) = -1
    # t=1: delta = 0 + 0.5*2 - 1 = 0;         A = 0 + 0.25*(-1) = -0.25
    close(adv, [[0.0, -0.25, -1.0, -2.0]])
    close(ret, [[0.0, 0.75, 1.0, 1.0]])


def test_gae_carries_value_and_advantage_forward_over_a_masked_gap() -> None:
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[9.0, 2.0, 7.0, 3.0]])  # 7 is a masked (tool output) token: never bootstrapped from
    mask = torch.tensor([[0, 1, 0, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    # t=3: A = 1 - 3 = -2; t=2 masked: carry V_next = 3, A_next = -2
    # t=1: delta = 0 + 0.5*3 - 2 = -0.5; A = -0.5 + 0.25*(-2) = -1
    close(adv, [[0.0, -1.0, 0.0, -2.0]])
    close(ret, [[0.0, 1.0, 0.0, 1.0]])


def reference_gae(rewards: list, values: list, mask: list, gamma: float, lam: float) -> tuple[list, list]:
    """Textbook GAE over the compacted valid tokens of one row, scattered back; zeros elsewhere."""
    idx = [t for t, m in enumerate(mask) if m]
    adv, ret = [0.0] * len(mask), [0.0] * len(mask)
    running, next_value = 0.0, 0.0
    for t in reversed(idx):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        next_value = values[t]
        adv[t], ret[t] = running, running + values[t]
    return adv, ret


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 4),
    t=st.integers(1, 9),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_gae_matches_the_per_row_loop(b: int, t: int, gamma: float, lam: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(b, t, generator=g, dtype=torch.float64)
    values = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.6
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    for row in range(b):
        exp_adv, exp_ret = reference_gae(rewards[row].tolist(), values[row].tolist(), mask[row].tolist(), gamma, lam)
        torch.testing.assert_close(adv[row].double(), torch.tensor(exp_adv, dtype=torch.float64), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ret[row].double(), torch.tensor(exp_ret, dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_whiten_uses_masked_mean_and_bessel_variance() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean = 2, var = (1 + 0 + 1) / (3 - 1) = 1 -> (x - 2) / 1; the masked 100 is ignored and zeroed
    close(whiten(x, mask), [[-1.0, 0.0, 1.0, 0.0]])
