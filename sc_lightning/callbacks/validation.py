"""ValidationMonitor: starts the validations the controller cannot start itself, and logs every ``val/*`` once.

The controller starts the validation of step N when the engine adopts version N (``finish_refit``); this callback
adds the ones no refit starts: version 0 (``val_at_start``), a resumed step whose validation had not been logged
(it was in flight at the kill: it is redone), and the final version when the run ended before ``max_num_steps``
(``val_at_end``). After each step it logs the validations that finished meanwhile, each at its own step, through
every logger (``val/reward``, ``val/accuracy``, ``val/completion_len_mean``, ``val/weight_version``, ...; see
:meth:`~sc_lightning.controller.validation.ValidationResult.metrics`).

Logged once: its state (saved with every checkpoint) is the last validated step it logged, and it never logs a
step again. A checkpoint first settles the validation in flight and logs it, so the bundle of step N says whether
N's validation was logged: a resume from it redoes that validation only if it was not.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from sc_lightning.config.algorithm import AlgorithmConfig
from sc_lightning.controller.api import ValidationResult


class ValidationMonitor(Callback):
    """Validations at their steps, logged once; list it after RefitCallback (its refit starts them)."""

    def __init__(self, algo: AlgorithmConfig) -> None:
        self.algo = algo
        self.last_logged_step = -1
        self.logged: list[ValidationResult] = []

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Validate the version the run starts from when it is due and not logged yet (version 0, or a resume)."""
        step = trainer.global_step
        if trainer.is_global_zero and self._due(step) and step > self.last_logged_step:
            trainer.strategy.rollout_side.controller.validate(step)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Log the validations finished since the last step."""
        if trainer.is_global_zero:
            self._log(trainer, trainer.strategy.rollout_side.controller.validation_results())

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Wait for the last validation (``val_at_end``: of the final version, started now if no refit did)."""
        if not trainer.is_global_zero or trainer.strategy.rollout_side.controller is None:
            return
        controller, step = trainer.strategy.rollout_side.controller, trainer.global_step
        self._log(trainer, controller.settle_validation())
        if self.algo.val_at_end and step > self.last_logged_step:
            controller.validate(step)
            self._log(trainer, controller.settle_validation())

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Settle and log the validation in flight, so the saved state says whether this step's was logged."""
        if trainer.is_global_zero and trainer.strategy.rollout_side.controller is not None:
            self._log(trainer, trainer.strategy.rollout_side.controller.settle_validation())
        checkpoint.setdefault("callbacks", {})[self.state_key] = self.state_dict()

    def state_dict(self) -> dict[str, Any]:
        """The last validated step logged."""
        return {"last_logged_step": self.last_logged_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the last validated step logged (a resume logs no step twice)."""
        self.last_logged_step = int(state_dict["last_logged_step"])

    def _due(self, step: int) -> bool:
        return self.algo.validation_due(step, last_step=self.algo.max_num_steps)

    def _log(self, trainer: Trainer, results: list[ValidationResult]) -> None:
        for result in results:
            if result.step <= self.last_logged_step:
                continue  # logged already: a step is logged once
            for logger in trainer.loggers:
                logger.log_metrics(result.metrics(), step=result.step)
            self.last_logged_step = result.step
            self.logged.append(result)


class ValidateOnce(Callback):
    """``validate``'s callback: once the strategy has started the controller (the engine holds the policy),
    validate that version, log it at its step and keep the result in :attr:`results`."""

    def __init__(self) -> None:
        self.results: list[ValidationResult] = []

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Run the validation and log it at its step."""
        if not trainer.is_global_zero:
            return
        controller = trainer.strategy.rollout_side.controller
        controller.validate(controller.stats().trainer_version)
        self.results.extend(controller.settle_validation())
        for result in self.results:
            for logger in trainer.loggers:
                logger.log_metrics(result.metrics(), step=result.step)
