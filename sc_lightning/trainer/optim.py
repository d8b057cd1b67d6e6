"""The trainer's optimizers: AdamW with its learning-rate schedule, and moving optimizer state between devices.

The model's parameter dtype and ``megatron_cfg.use_distributed_optimizer`` pick the recipe. fp32 parameters (CPU
runs, and GPU runs with ``precision: fp32``) train with torch's AdamW directly: the parameters are their own master
weights (with several data-parallel ranks, over megatron-core DDP's summed gradients:
:class:`~sc_lightning.trainer.data_parallel.DataParallelAdamW`). bf16 parameters, and any model with the distributed
optimizer, train through megatron-core's optimizer stack
(:class:`~sc_lightning.trainer.megatron_optimizer.MegatronAdamW`): fp32 gradient accumulation, fp32 main weights and
fp32 AdamW state, sliced over the data-parallel ranks when distributed. All skip weight decay on biases and 1-D
parameters (norm weights), as megatron does.
"""

from __future__ import annotations

import torch

from sc_lightning.config.model import OptimizerConfig
from sc_lightning.trainer.data_parallel import DataParallelAdamW, data_parallel_size
from sc_lightning.trainer.lr_schedule import lr_multiplier
from sc_lightning.trainer.pipeline import pipeline_parallel_size


def decays(name: str, param: torch.Tensor) -> bool:
    """Whether weight decay applies to parameter ``name``: matrices yes; biases and 1-D (norm) weights no."""
    return param.dim() > 1 and not name.endswith(".bias")


def needs_grad_finalising(model: torch.nn.Module) -> bool:
    """Whether ``model``'s gradients need megatron's DDP buffer and ``finalize_model_grads``: a sum over data-parallel
    replicas, tied embeddings across pipeline stages, or norm weights summed over TP (sequence-parallel norms; a
    QK-norm model's q/k norms, each TP rank seeing only its own heads)."""
    config = getattr(model, "config", None)
    sequence_parallel = getattr(config, "sequence_parallel", False)
    split_qk_norms = getattr(config, "qk_layernorm", False) and getattr(config, "tensor_model_parallel_size", 1) > 1
    return data_parallel_size() > 1 or pipeline_parallel_size() > 1 or sequence_parallel or split_qk_norms


def adamw(
    model: torch.nn.Module, opt_cfg: OptimizerConfig, total_steps: int, *, distributed: bool = False
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model`` (mixed precision when its parameters are bf16; megatron's distributed optimizer with
    ``distributed``) and its learning-rate schedule.

    ``total_steps`` bounds the decay. bf16 parameters must be on a CUDA device.
    """
    if distributed or next(model.parameters()).dtype == torch.bfloat16:
        from sc_lightning.trainer.megatron_optimizer import MegatronAdamW

        optimizer: torch.optim.Optimizer = MegatronAdamW(model, opt_cfg, distributed=distributed)
    else:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [
            {"params": [p for n, p in named if decays(n, p)], "weight_decay": opt_cfg.weight_decay},
            {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0},
        ]
        adam = {"lr": opt_cfg.lr, "betas": (opt_cfg.adam_beta1, opt_cfg.adam_beta2), "eps": opt_cfg.adam_eps}
        if needs_grad_finalising(model):
            optimizer = DataParallelAdamW(model, groups, opt_cfg.clip_grad, **adam)
        else:
            optimizer = torch.optim.AdamW(groups, **adam)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(opt_cfg, total_steps=total_steps))


def optimizer_state_to(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move ``optimizer``'s state tensors (AdamW moments; the step counters stay where torch keeps them)."""
    for state in optimizer.state.values():
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and name != "step":
                state[name] = value.to(device, non_blocking=True)
