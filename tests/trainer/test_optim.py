"""The optimizer recipe follows the parameters' dtype; weight decay skips biases and norm weights; the clip is the
optimizer's."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.config.model import OptimizerConfig
from sc_lightning.models import build_gpt_model, builtin_spec
from sc_lightning.trainer.data_parallel import DataParallelAdamW
from sc_lightning.trainer.optim import adamw
from sc_lightning.trainer.policy_update import normalised_step


def test_fp32_adamw_decays_matrices_only() -> None:
    model = build_gpt_model(builtin_spec("builtin:tiny"), precision="fp32", seed=0)
    optimizer, _ = adamw(model, OptimizerConfig(lr=0.1, weight_decay=0.5), total_steps=10)
    assert isinstance(optimizer, torch.optim.AdamW)
    norms = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() == 1}
    matrices = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() > 1}
    assert norms and matrices
    for param in model.parameters():
        param.grad = torch.zeros_like(param)  # only the decay can move a parameter
    optimizer.step()
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], before) for n, before in norms.items())
    assert all(torch.allclose(params[n], before * (1 - 0.1 * 0.5)) for n, before in matrices.items())


def test_bf16_parameters_on_a_cpu_get_a_clear_error_not_a_bad_recipe() -> None:
    model = build_gpt_model(builtin_spec("builtin:tiny"), precision="bf16", seed=0)
    with pytest.raises(ValueError, match=r"needs a CUDA device.*set policy.precision .* to fp32"):
        adamw(model, OptimizerConfig(), total_steps=10)


def test_an_update_told_another_clip_than_its_optimizers_is_an_error() -> None:
    """An optimizer that clips inside its step (megatron DDP's summed gradients) clips to its own config's value: an
    update asked for another would silently clip differently."""
    model = build_gpt_model(builtin_spec("builtin:tiny"), precision="fp32", seed=0)
    optimizer = DataParallelAdamW(model, [{"params": list(model.parameters())}], clip_grad=1.0, lr=0.1)
    with pytest.raises(ValueError, match=r"clips to its own clip_grad 1.0, but this update was asked to clip to 0.05"):
        normalised_step(model, optimizer, normaliser=1.0, clip_grad=0.05)
