"""The critic: a megatron-core GPT with a scalar head — zero at start, causal and log-prob aligned, trainable."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.models.megatron import load_policy
from sc_lightning.models.value import ValueHead, load_critic, token_values

pytestmark = pytest.mark.usefixtures("model_parallel")


def test_a_fresh_critic_predicts_zero_and_its_own_parameters_are_separate_from_the_policy() -> None:
    critic = load_critic("builtin:tiny", precision="fp32", seed=3)
    policy, _, _ = load_policy("builtin:tiny", precision="fp32", seed=3)
    ids = torch.randint(0, 18, (3, 7))
    values = token_values(critic, ids)
    assert values.shape == (3, 7) and values.dtype == torch.float32 and torch.equal(values, torch.zeros(3, 7))
    assert isinstance(critic.output_layer, ValueHead) and not critic.share_embeddings_and_output_weights
    shared = {p.data_ptr() for p in policy.parameters()} & {p.data_ptr() for p in critic.parameters()}
    assert not shared  # training the critic never moves the policy


def test_values_are_causal_and_aligned_with_logprobs() -> None:
    """values[:, t] is the state before token t: it changes with tokens < t only, and is 0 at t = 0."""
    critic = load_critic("builtin:tiny", precision="fp32", seed=3).eval()
    torch.nn.init.normal_(critic.output_layer.weight)
    ids = torch.randint(0, 18, (2, 8))
    changed = ids.clone()
    changed[:, 5] = (ids[:, 5] + 1) % 18
    with torch.no_grad():
        before, after = token_values(critic, ids), token_values(critic, changed)
    assert torch.equal(before[:, 0], torch.zeros(2))
    assert torch.equal(before[:, :6], after[:, :6])  # positions 0..5 do not see token 5
    assert not torch.equal(before[:, 6:], after[:, 6:])


def test_the_critic_regresses_onto_targets() -> None:
    critic = load_critic("builtin:tiny", precision="fp32", seed=3)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    ids = torch.randint(0, 18, (4, 6))
    target = (ids[:, :-1] % 3 - 1).float()  # a function of the token before each position: learnable
    first = None
    for _ in range(60):
        loss = (token_values(critic, ids)[:, 1:] - target).square().mean()
        first = first if first is not None else float(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss) < 0.05 * first


def test_the_critic_round_trips_through_a_distributed_checkpoint(tmp_path) -> None:
    """megatron's sharded state dict reads an output layer's ``weight``: the value head's parameters carry that name
    (with ``linear.weight`` it raised KeyError on the first multi-rank PPO bundle)."""
    from sc_lightning.trainer.sharded_checkpoint import load_sharded, save_sharded

    critic = load_critic("builtin:tiny", precision="fp32", seed=3)
    torch.nn.init.normal_(critic.output_layer.weight)
    save_sharded(tmp_path / "sharded", {"critic": (critic, None)})
    fresh = load_critic("builtin:tiny", precision="fp32", seed=4)
    load_sharded(tmp_path / "sharded", {"critic": (fresh, None)})
    for (name, saved), loaded in zip(critic.state_dict().items(), fresh.state_dict().values(), strict=True):
        if isinstance(saved, torch.Tensor):
            assert torch.equal(saved, loaded), name


def test_a_head_saved_under_its_former_names_still_loads() -> None:
    head = ValueHead(4, torch.float32)
    head.load_state_dict({"linear.weight": torch.ones(1, 4), "linear.bias": torch.full((1,), 2.0)})
    assert torch.equal(head.weight, torch.ones(1, 4)) and torch.equal(head.bias, torch.full((1,), 2.0))
