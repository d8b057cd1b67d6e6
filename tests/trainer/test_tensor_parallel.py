"""Tensor parallelism in real processes (gloo on the CPU): TP=2 policy and critic updates, with and without sequence
parallelism, equal single-process ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sc_lightning.config.algorithm import GAEAdvantage, ValueLossConfig
from sc_lightning.config.model import OptimizerConfig
from sc_lightning.models import build_gpt_model
from sc_lightning.models.value import load_critic, values_from_output
from sc_lightning.trainer.critic_update import CriticUpdate, value_targets
from sc_lightning.trainer.grad_clip import clip_model_parallel_grads
from sc_lightning.trainer.optim import adamw
from sc_lightning.trainer.pipeline import per_token_forward
from tests.helpers.parallel import assert_ppo_matches_one_process, train_ppo_three_steps, train_three_steps
from tests.helpers.train_rows import SPEC, critic_rows, step_rows
from tests.ranks import run_ranks

STEPS = 3
QK_NORM = SPEC.replace(arch="qwen3", qkv_bias=False)  # Qwen3: per-head q/k norms, shared by the heads of all ranks


def _tensor_parallel_rank(rank: int, world_size: int, sequence_parallel: bool, out: Path) -> None:
    """A rank of the TP runs: train the policy and the critic, then save what it saw (all ranks gather everything)."""
    layout = {"tensor_parallel_size": world_size, "sequence_parallel": sequence_parallel}
    torch.save(train_three_steps(**layout)[:2], out / f"policy{rank}.pt")
    torch.save(train_critic_three_times(**layout), out / f"critic{rank}.pt")


@pytest.fixture(scope="module", params=[False, True], ids=["tp2", "tp2-sequence-parallel"])
def tp2_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the two ranks of one TP=2 run (policy, then critic) left their results."""
    out = tmp_path_factory.mktemp("tp2")
    run_ranks(_tensor_parallel_rank, 2, request.param, out)
    return out


def matching_rank_outputs(single_metrics: list[dict[str, float]], results: Path, run: str, keys: tuple) -> list:
    """Each TP rank's saved output of ``run``, after checking the rank's metrics against the single process's."""
    assert all(m["grad_norm"] > 0.05 for m in single_metrics), "the clip must bite for the test to check the norm"
    outputs = []
    for rank in range(2):
        metrics, output = torch.load(results / f"{run}{rank}.pt")
        for one, split in zip(single_metrics, metrics, strict=True):
            for key in keys:
                assert split[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), (rank, key)
        outputs.append(output)
    return outputs


@pytest.mark.slow  # its tp2_results start ranks in processes (a minute or more)
@pytest.mark.timeout(600)
def test_a_tp2_policy_update_equals_the_single_process_one(tp2_results: Path) -> None:
    single_metrics, single_weights, *_ = train_three_steps(tensor_parallel_size=1)
    keys = ("loss", "grad_norm", "global_valid_toks", "approx_entropy")
    for rank, weights in enumerate(matching_rank_outputs(single_metrics, tp2_results, "policy", keys)):
        assert weights.keys() == single_weights.keys()
        for name, tensor in single_weights.items():
            # TP sums the row-parallel products in another order; AdamW's m / sqrt(v) turns that order noise on a
            # near-zero gradient into a visible move (measured: at most 1.2e-6 on one element in 4096), so 0.2% of
            # lr (1e-3) absolute, where a wrong gradient moves weights by up to lr a step
            torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=2e-6, msg=f"rank {rank}: {name}")


def _qk_norm_rank(rank: int, world_size: int, out: Path) -> None:
    """A rank of the TP=2 QK-norm run: train the Qwen3-style policy, save its metrics and weights."""
    torch.save(train_three_steps(tensor_parallel_size=world_size, spec=QK_NORM)[:2], out / f"qk{rank}.pt")


@pytest.mark.slow  # starts ranks in processes
@pytest.mark.timeout(600)
def test_a_tp2_qk_norm_policy_update_equals_the_single_process_one(tmp_path: Path) -> None:
    """Each TP rank's q/k norm gradient covers only its own heads; summed over the ranks, the update is one
    process's (without the sum the norms would drift apart between ranks)."""
    run_ranks(_qk_norm_rank, 2, tmp_path)
    single_metrics, single_weights, *_ = train_three_steps(tensor_parallel_size=1, spec=QK_NORM)
    for rank, weights in enumerate(matching_rank_outputs(single_metrics, tmp_path, "qk", ("loss", "grad_norm"))):
        assert any("q_norm" in name for name in weights)
        for name, tensor in single_weights.items():
            # order noise through AdamW as above (measured here: one element of 4096 moved 3.4e-6); a q/k norm whose
            # gradient lacks the other rank's heads moves by up to lr (1e-3) a step
            torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=5e-6, msg=f"rank {rank}: {name}")


def train_critic_three_times(
    tensor_parallel_size: int, sequence_parallel: bool = False
) -> tuple[list[dict[str, float]], torch.Tensor]:
    """Three critic updates (two epochs each) of the seeded tiny critic; the metrics and its values afterwards."""
    critic = load_critic(
        "builtin:tiny", precision="fp32", seed=5, tp=tensor_parallel_size, sequence_parallel=sequence_parallel
    )
    optimizer, _ = adamw(critic, OptimizerConfig(lr=1e-3, clip_grad=0.05), STEPS)  # the clip CriticUpdate names
    update = CriticUpdate(
        critic, optimizer, ValueLossConfig(value_clip_epsilon=0.2), micro_batch_size=4, clip_grad=0.05
    )
    metrics = []
    for _ in range(STEPS):
        targets = value_targets(critic, critic_rows(), GAEAdvantage(gae_lambda=0.95, gae_gamma=1.0), micro_batch_size=3)
        metrics.append(update.train(critic_rows(), targets, epochs=2))
    probe = step_rows(0)  # all its weights, through the values at every position a loss reads
    return metrics, per_token_forward(critic, probe, probe.plan(4), lambda _, output: values_from_output(output))


@pytest.mark.slow  # its tp2_results start ranks in processes (a minute or more)
@pytest.mark.timeout(600)
def test_a_tp2_critic_update_equals_the_single_process_one(tp2_results: Path) -> None:
    single_metrics, single_values = train_critic_three_times(tensor_parallel_size=1)
    keys = ("loss", "grad_norm", "explained_var", "returns_mean")
    for values in matching_rank_outputs(single_metrics, tp2_results, "critic", keys):
        torch.testing.assert_close(values, single_values, rtol=1e-5, atol=2e-6)  # all weights, through the values


def test_in_one_process_the_clip_is_torchs() -> None:
    one, other = build_gpt_model(SPEC, seed=0), build_gpt_model(SPEC, seed=0)
    for model in (one, other):
        model(step_rows(1).input_ids, None, None).float().square().mean().backward()
    expected = torch.nn.utils.clip_grad_norm_(list(one.parameters()), 0.01)
    assert clip_model_parallel_grads(list(other.parameters()), 0.01) == pytest.approx(float(expected), rel=1e-6)
    for a, b in zip(one.parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0.0)


def _ppo_tensor_parallel_rank(rank: int, world_size: int, out: Path) -> None:
    """A rank of a TP=2 PPO run: the policy's whole weights and the critic's probe values after three steps."""
    torch.save(train_ppo_three_steps(tensor_parallel_size=2, gathered=True), out / f"ppo{rank}.pt")


@pytest.mark.slow  # ranks in processes, a minute or more on 2 cores
@pytest.mark.timeout(600)
def test_a_tp2_ppo_step_equals_the_single_process_one(tmp_path: Path) -> None:
    """Value stage, critic and policy epochs, frozen pi_old and the KL term, all at TP=2."""
    run_ranks(_ppo_tensor_parallel_rank, 2, tmp_path)
    assert_ppo_matches_one_process(tmp_path, 2, gathered=True)
