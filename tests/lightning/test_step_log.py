"""StepLog writes the same logger rows and callback metrics as Lightning's ``self.log(on_step=True)``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger

from sc_lightning.lightning.step_log import StepLog


class _Stepper(LightningModule):
    """A one-parameter model trained for a few steps, logging two metrics per step from a callback."""

    def __init__(self, *, step_log: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.step_log = StepLog() if step_log else None

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = (self.weight * batch).sum()
        metrics = {"train/loss": float(loss), "train/index": float(batch_idx)}
        if self.step_log is None:
            self.log_dict(metrics, on_step=True, batch_size=1)
        else:
            self.step_log.log(self.trainer, metrics)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.step_log is not None:
            self.step_log.flush(self.trainer)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.arange(7.0).unsqueeze(1), batch_size=1)


class _Seen(Callback):
    """Records the callback metrics every step's callbacks saw."""

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self.seen.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def _fit(tmp_path: Path, *, step_log: bool, every: int) -> tuple[list[dict[str, str]], list[dict[str, float]]]:
    """The metrics.csv rows and the callback metrics of a 7-step fit."""
    seen = _Seen()
    logger = CSVLogger(tmp_path, name="step_log" if step_log else "self_log")
    trainer = Trainer(
        max_epochs=1,
        logger=logger,
        log_every_n_steps=every,
        callbacks=[seen],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
    )
    trainer.fit(_Stepper(step_log=step_log))
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        return list(csv.DictReader(f)), seen.seen


@pytest.mark.parametrize("every", [1, 3])
def test_step_log_rows_match_self_log(tmp_path: Path, every: int) -> None:
    """Same rows (step, epoch, values, cadence) and the same callback metrics at every step."""
    expected_rows, expected_seen = _fit(tmp_path, step_log=False, every=every)
    rows, seen = _fit(tmp_path, step_log=True, every=every)
    assert rows == expected_rows
    assert seen == expected_seen
    assert len(rows) == (7 // every if every > 1 else 7)
