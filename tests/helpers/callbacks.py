"""Callbacks a test's ``fit`` process loads through ``--trainer.callbacks+=tests.helpers.callbacks.NAME`` (the child
starts from the repository root, so ``tests`` imports there)."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class BundleHoldsABufferedGroup(Callback):
    """Each bundle's cut waits until the buffer holds a committed group that no step has claimed.

    A bundle is cut right after its step's refit, while the pump generates the next step's groups: whether one of
    them is committed by the cut is a race. A test that needs a buffered group in the bundle (a group-size refusal)
    adds this callback. ``on_save_checkpoint`` runs inside the bundle's ``trainer.save_checkpoint``, before the
    controller's snapshot, so the snapshot indexes that group.
    """

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Poll the controller's counts until a group is ready, for at most ``timeout_s``."""
        controller = trainer.strategy.rollout_side.controller
        deadline = time.monotonic() + self.timeout_s
        while controller.stats().ready < 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no buffered group after {self.timeout_s} s at step {trainer.global_step}'s cut")
            time.sleep(0.005)
