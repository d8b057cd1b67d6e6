"""The learning-rate schedule: linear warm-up to the peak rate, then constant, linear or cosine decay to min_lr."""

from __future__ import annotations

import math
from collections.abc import Callable

from sc_lightning.config.model import OptimizerConfig


def lr_multiplier(config: OptimizerConfig, *, total_steps: int) -> Callable[[int], float]:
    """``step -> factor of lr`` for ``LambdaLR``; ``total_steps`` bounds the decay when ``lr_decay_steps`` is null.

    Step ``s`` (0-based, counted in optimizer steps) warms up as ``(s + 1) / warmup_steps``; after warm-up the
    decay runs over ``lr_decay_steps`` steps (default: the rest of the run) and then holds ``min_lr``.
    """
    warmup = config.warmup_steps
    decay_steps = config.lr_decay_steps or max(1, total_steps - warmup)
    floor = config.min_lr / config.lr

    def factor(step: int) -> float:
        """The multiplier of lr at optimizer step ``step``."""
        if step < warmup:
            return (step + 1) / warmup
        if config.lr_decay_style == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / decay_steps)
        if config.lr_decay_style == "linear":
            return floor + (1.0 - floor) * (1.0 - progress)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine

    return factor
