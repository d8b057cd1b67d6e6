"""On one GPU: bf16 training keeps fp32 master weights, fp32 gradients and fp32 AdamW state (megatron's stack),
also through megatron's distributed optimizer."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.config.model import OptimizerConfig
from sc_lightning.models import build_gpt_model, builtin_spec
from sc_lightning.trainer.megatron_optimizer import MegatronAdamW
from sc_lightning.trainer.optim import adamw
from sc_lightning.trainer.policy_update import PolicyUpdate
from sc_lightning.trainer.sharded_checkpoint import load_sharded, save_sharded
from tests.helpers.train_rows import step_rows

pytestmark = pytest.mark.gpu

SPEC = builtin_spec("builtin:tiny")
CUDA = torch.device("cuda", 0)


def one_step(
    precision: str, *, micro_batch_size: int = 4, distributed: bool = False, seed: int = 0
) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict]:
    """A fresh tiny policy on the GPU after one GRPO step over the same rows (megatron's distributed optimizer with
    ``distributed``)."""
    model = build_gpt_model(SPEC, precision=precision, seed=seed, device=CUDA)
    optimizer, _ = adamw(model, OptimizerConfig(lr=1e-3, weight_decay=0.1), total_steps=1, distributed=distributed)
    return model, optimizer, train_on(model, optimizer, step_rows(1), micro_batch_size=micro_batch_size)


def train_on(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rows, *, micro_batch_size: int = 4) -> dict:
    """One GRPO step of ``model`` over ``rows``; its metrics."""
    loss_fn = ClippedPGLoss(reference_policy_kl_penalty=0.0)
    update = PolicyUpdate(model, optimizer, loss_fn, micro_batch_size=micro_batch_size, clip_grad=1.0)
    update.begin()
    update.train_chunk(rows.to(CUDA))
    return update.finish()


def masters(optimizer: MegatronAdamW) -> list[torch.Tensor]:
    """The fp32 master copies."""
    return [master for _, master in optimizer.master_pairs()]


def test_bf16_steps_fp32_masters_and_tracks_the_fp32_update() -> None:
    model, optimizer, metrics = one_step("bf16")
    assert isinstance(optimizer, MegatronAdamW)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in masters(optimizer)} == {torch.float32}
    assert all(state["exp_avg"].dtype == torch.float32 for state in optimizer.state.values())
    pairs = optimizer.master_pairs()
    assert len(pairs) == len(list(model.parameters()))
    for low, master in pairs:
        assert torch.equal(low, master.to(torch.bfloat16))  # the bf16 weights are the masters, rounded
    reference, _, fp32 = one_step("fp32")
    assert metrics["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.05)  # bf16 forward, fp32 accumulation
    assert metrics["global_valid_toks"] == fp32["global_valid_toks"]
    moved = [
        (a.float() - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    ]
    assert max(moved) < 2e-2  # one lr=1e-3 step apart at most, plus bf16 rounding of the weights


def test_micro_batching_changes_nothing_but_rounding_and_a_step_without_gradients_changes_nothing() -> None:
    _, _, one = one_step("bf16", micro_batch_size=16)
    model, optimizer, four = one_step("bf16", micro_batch_size=3)
    assert one["grad_norm"] == pytest.approx(four["grad_norm"], rel=1e-2)
    before = [p.detach().clone() for p in masters(optimizer)]
    optimizer.zero_grad()
    optimizer.step()  # PPO's critic warm-up counts a step this way
    assert all(torch.equal(a, b) for a, b in zip(before, masters(optimizer), strict=True))


def test_the_state_round_trips_through_a_checkpoint() -> None:
    model, optimizer, _ = one_step("bf16")
    state = optimizer.state_dict()
    fresh = build_gpt_model(SPEC, precision="bf16", seed=1, device=CUDA)
    fresh.load_state_dict(model.state_dict())
    restored, _ = adamw(fresh, OptimizerConfig(lr=1e-3, weight_decay=0.1), total_steps=1)
    restored.load_state_dict(state)
    for a, b in zip(masters(optimizer), masters(restored), strict=True):
        assert torch.equal(a, b)
    moments = [s["exp_avg_sq"] for s in restored.state.values()]
    assert moments and all(m.dtype == torch.float32 and bool(m.abs().sum() > 0) for m in moments)
    restored.param_groups[0]["lr"] = 0.5  # what a learning-rate schedule does after a resume
    assert restored.megatron.optimizer.param_groups[0]["lr"] == 0.5  # ... reaches the AdamW that steps


def test_a_distributed_checkpoint_restores_the_bf16_weights_fp32_masters_and_moments(tmp_path) -> None:
    """megatron's mixed-precision state through dist_checkpointing: a model built from another seed, loaded, takes
    the same next step as the one that saved."""
    model, optimizer, _ = one_step("bf16")
    save_sharded(tmp_path / "sharded", {"policy": (model, optimizer)})
    other = build_gpt_model(SPEC, precision="bf16", seed=99, device=CUDA)
    other_optimizer, _ = adamw(other, OptimizerConfig(lr=1e-3, weight_decay=0.1), total_steps=1)
    load_sharded(tmp_path / "sharded", {"policy": (other, other_optimizer)})
    for a, b in zip(masters(optimizer), masters(other_optimizer), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    for state, loaded in zip(optimizer.state.values(), other_optimizer.state.values(), strict=True):
        assert torch.equal(state["exp_avg_sq"], loaded["exp_avg_sq"])
    for net, opt in ((model, optimizer), (other, other_optimizer)):
        train_on(net, opt, step_rows(2))
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_distributed_optimizer_takes_the_mixed_precision_step_and_resumes_it(tmp_path) -> None:
    """One GPU (DP=1: one slice): megatron's distributed optimizer steps the bf16 model like the mixed-precision
    optimizer; a model from another seed loaded from its distributed checkpoint takes the same next step."""
    reference, _, expected = one_step("bf16")
    model, optimizer, metrics = one_step("bf16", distributed=True)
    assert optimizer.distributed
    assert {state["exp_avg"].dtype for state in optimizer.state.values()} == {torch.float32}
    assert metrics["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-6)  # the same fp32 update, rounded to bf16
    save_sharded(tmp_path / "sharded", {"policy": (model, optimizer)})
    other = build_gpt_model(SPEC, precision="bf16", seed=99, device=CUDA)
    other_optimizer, _ = adamw(other, OptimizerConfig(lr=1e-3, weight_decay=0.1), total_steps=1, distributed=True)
    load_sharded(tmp_path / "sharded", {"policy": (other, other_optimizer)})
    for net, opt in ((model, optimizer), (other, other_optimizer)):
        train_on(net, opt, step_rows(2))
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
