"""StepLog: an RL step's scalar metrics, written to every Lightning logger as one row after the step's callbacks.

Every metric sc_lightning logs per step (``train/*``, ``timing/*``, ``perf/*``, ``rollout/*``, ``goodput/*``, ...)
is a scalar already reduced over the data-parallel ranks, so Lightning's ``self.log`` machinery (a result metric
per key, moved between devices and updated on every call) adds nothing but its cost: about 1 ms per key on a CPU
core, and a step logs some 70 keys — on the tiny example that was a third of every step. StepLog keeps the same
contract at a dictionary update per key: the values reach ``trainer.callback_metrics`` at once (callbacks that rank
or monitor a metric read them there), and the module flushes them in ``on_train_batch_end`` — after every callback's
``on_train_batch_end`` — through Lightning's logger connector, so the row has the step, the ``epoch`` column and the
``trainer.log_every_n_steps`` cadence that ``self.log`` gives. The progress bar's few values still go through
``self.log``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from lightning.pytorch import Trainer


class StepLog:
    """Collects one RL step's scalar metrics and writes them to the loggers once, as ``self.log(on_step=True)``
    would."""

    def __init__(self) -> None:
        self._pending: dict[str, float] = {}

    def log(self, trainer: Trainer, metrics: Mapping[str, float | torch.Tensor]) -> None:
        """Add ``metrics`` to the step's row and to ``trainer.callback_metrics``."""
        values = {name: float(value) for name, value in metrics.items()}
        self._pending.update(values)
        trainer.callback_metrics.update({name: torch.tensor(value) for name, value in values.items()})

    def flush(self, trainer: Trainer) -> None:
        """Write the step's row to every logger (on the steps Lightning's ``log_every_n_steps`` logs)."""
        pending, self._pending = self._pending, {}
        connector = trainer._logger_connector  # the step, epoch and cadence that self.log would use
        if pending and connector.should_update_logs:
            connector.log_metrics(pending)
