"""Where a dead rank was noticed: ``training_phase`` reads the RL step and the hook Lightning is running, checked
inside a real (tiny) Lightning fit, so a Lightning that stops recording its current hook fails here."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from sc_lightning.trainer.rank_deaths import training_phase


class Recorder(LightningModule):
    """One linear layer, fitted for two steps; records the phase inside ``training_step`` and after each step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list[str] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(training_phase(self))
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.ones(2, 2), batch_size=1)


class AfterStep(Callback):
    def on_train_batch_end(self, trainer: Trainer, pl_module: Recorder, *args: Any) -> None:
        pl_module.seen.append(training_phase(pl_module))


def test_the_phase_names_the_rl_step_and_the_running_hook() -> None:
    module = Recorder()
    assert training_phase(module) == "before training"
    trainer = Trainer(
        accelerator="cpu", max_steps=2, callbacks=[AfterStep()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module)
    assert module.seen == [
        "at RL step 0, in training_step",
        "at RL step 1, in on_train_batch_end",
        "at RL step 1, in training_step",
        "at RL step 2, in on_train_batch_end",
    ]
