"""The critic's step: explained variance, and an update that does not depend on the micro-batch size."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.config.algorithm import GAEAdvantage, ValueLossConfig
from sc_lightning.models.value import load_critic
from sc_lightning.trainer.critic_update import CriticUpdate, explained_variance, value_targets
from tests.helpers.train_rows import critic_rows

pytestmark = pytest.mark.usefixtures("model_parallel")


def test_explained_variance_by_hand() -> None:
    returns = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])  # over [1, 2, 3]: Var = 1
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)  # a perfect critic
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)  # the mean only
    residual = torch.tensor([[9.0, 1.5, 2.0, 2.5]])  # R - V = [-0.5, 0, 0.5]: Var 0.25 (position 0 is masked)
    assert explained_variance(residual, returns, mask) == pytest.approx(0.75)
    assert explained_variance(returns, torch.ones_like(returns), mask) == 0.0  # returns that do not vary


def test_explained_variance_keeps_to_the_device_of_its_inputs() -> None:
    """Every tensor it makes is on its inputs' device: the PPO twin on a GPU once failed here ("expected all tensors
    to be on the same device") with a count made on the default device. A meta default device makes any such tensor
    disagree with the CPU inputs, as the CPU default did with CUDA inputs."""
    returns = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    residual = torch.tensor([[9.0, 1.5, 2.0, 2.5]])
    with torch.device("meta"):
        assert explained_variance(residual, returns, torch.tensor([[0.0, 1.0, 1.0, 1.0]], device="cpu")) == (
            pytest.approx(0.75)
        )


@pytest.mark.parametrize("micro_batch_size", [1, 4])
def test_the_critic_update_does_not_depend_on_the_micro_batch_size(micro_batch_size: int) -> None:
    results = []
    for size in (6, micro_batch_size):
        critic = load_critic("builtin:tiny", precision="fp32", seed=5)
        update = CriticUpdate(
            critic,
            torch.optim.AdamW(critic.parameters(), lr=1e-2),
            ValueLossConfig(value_clip_epsilon=0.2),
            micro_batch_size=size,
            clip_grad=1.0,
        )
        targets = value_targets(critic, critic_rows(), GAEAdvantage(gae_lambda=1.0, gae_gamma=1.0), micro_batch_size=3)
        metrics = update.train(critic_rows(), targets, epochs=2)
        results.append((metrics, critic.output_layer.weight.detach().clone()))
    (whole, w_whole), (split, w_split) = results
    assert split["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    assert torch.allclose(w_split, w_whole, atol=1e-6)
    # gamma = lambda = 1: every valid token's return is its row's reward; 17 valid tokens, 8 of them rewarded
    assert whole["returns_mean"] == pytest.approx(8 / 17)
