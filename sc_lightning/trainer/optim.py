"""The trainer's optimizers: AdamW with its learning-rate schedule, and moving optimizer state between devices."""

from __future__ import annotations

import torch

from sc_lightning.config.model import OptimizerConfig
from sc_lightning.trainer.lr_schedule import lr_multiplier


def adamw(
    model: torch.nn.Module, opt_cfg: OptimizerConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model`` and its learning-rate schedule (``total_steps`` bounds the decay)."""
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=opt_cfg.lr,
        betas=(opt_cfg.adam_beta1, opt_cfg.adam_beta2),
        eps=opt_cfg.adam_eps,
        weight_decay=opt_cfg.weight_decay,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(opt_cfg, total_steps=total_steps))


def optimizer_state_to(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move ``optimizer``'s state tensors (AdamW moments; the step counters stay where torch keeps them)."""
    for state in optimizer.state.values():
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and name != "step":
                state[name] = value.to(device, non_blocking=True)
