"""The learning-rate schedule: warm-up, then constant, linear or cosine decay to min_lr, then min_lr."""

from __future__ import annotations

import math

import pytest

from sc_lightning.config.model import OptimizerConfig
from sc_lightning.trainer.lr_schedule import lr_multiplier


def rates(total_steps: int = 14, **knobs: object) -> list[float]:
    config = OptimizerConfig(**{"lr": 1e-3, **knobs})
    factor = lr_multiplier(config, total_steps=total_steps)
    return [config.lr * factor(step) for step in range(total_steps + 3)]


def test_constant_holds_the_peak_after_warm_up() -> None:
    assert rates(warmup_steps=4)[:6] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert rates() == pytest.approx([1e-3] * 17)


def test_linear_decays_to_min_lr_at_the_last_step_and_holds_it() -> None:
    lr = rates(warmup_steps=4, lr_decay_style="linear", min_lr=1e-4)
    assert lr[3] == pytest.approx(1e-3)  # the warm-up's last step reaches the peak
    assert lr[4] == pytest.approx(1e-3)  # decay starts from the peak
    assert lr[9] == pytest.approx(1e-3 - 0.5 * 9e-4)  # halfway through the 10 decay steps
    assert lr[14:] == pytest.approx([1e-4] * 3)
    assert all(a >= b for a, b in zip(lr[3:], lr[4:], strict=False))


def test_cosine_follows_the_half_cosine_and_lr_decay_steps_overrides_the_run_length() -> None:
    lr = rates(lr_decay_style="cosine", min_lr=0.0, lr_decay_steps=8)
    expected = [1e-3 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / 8))) for s in range(17)]
    assert lr == pytest.approx(expected)
    assert lr[8:] == pytest.approx([0.0] * 9)
