"""InterruptCheck: a Ctrl-C that a library swallowed while the run started stops it before its next step."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from sc_lightning.interrupt import InterruptWatch


class InterruptCheck(Callback):
    """Raise the KeyboardInterrupt ``watch`` saw (see :mod:`sc_lightning.interrupt`) before each training step, so
    Lightning stops the run gracefully as for any Ctrl-C."""

    def __init__(self, watch: InterruptWatch) -> None:
        self.watch = watch

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """Raise a SIGINT that came while nothing was listening for it."""
        self.watch.check()
