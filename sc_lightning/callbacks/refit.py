"""RefitCallback: after every RL step, push the policy's new weights to the generation engine.

on_train_batch_end (the optimizer step is done, global_step = v): ``trainer.strategy.refit(v)``, one controller call
    begin_refit(v)     release the step's rows; close dispatch; abort in-flight rollouts that can never be trained
    push_weights(v)    export the policy under HF names and load it into the engine (skipped while a PPO
                       critic warm-up leaves the policy unchanged: the module's ``policy_trained`` is False)
    finish_refit(v)    new rollouts are stamped with version v; dispatch reopens
"""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class RefitCallback(Callback):
    """Syncs weights to the engine after each RL step; logs the weight-sync and step times and ``rollout/*``.

    When the strategy's engine is colocated (``policy.generation.colocated.enabled``), the engine also stands down
    for each train step and wakes with the refit.
    """

    def __init__(self) -> None:
        self._last_step_end: float | None = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Colocated: the engine stands down for the whole train step (its requests and deadlines freeze)."""
        if trainer.strategy.colocated:
            trainer.strategy.stand_down_engine()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start the step clock."""
        self._last_step_end = time.monotonic()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Refit the engine to the weights the step just produced."""
        started = time.monotonic()
        report = trainer.strategy.refit(trainer.global_step, wake=trainer.strategy.colocated)
        now = time.monotonic()
        pl_module.log("timing/train/weight_sync", now - started, on_step=True, batch_size=1)
        if self._last_step_end is not None:
            step_time = now - self._last_step_end
            pl_module.log("timing/train/total_step_time", step_time, on_step=True, batch_size=1)
            pl_module.log("step_s", step_time, prog_bar=True, logger=False, on_step=True, batch_size=1)
        self._last_step_end = now
        stats = report.stats
        step = {
            "aborted_stale_inflight_groups": report.aborted,
            "dropped_prompt_groups": stats.last_step.dropped,
            "replaced_prompt_groups": stats.last_step.replaced,
            "promoted_prompt_groups": stats.last_step.promoted,
        }
        pl_module.log_dict({f"train/{k}": float(v) for k, v in step.items()}, on_step=True, batch_size=1)
        self._log_rollout_stats(pl_module, stats)

    @staticmethod
    def _log_rollout_stats(pl_module: LightningModule, stats: Any) -> None:
        """The controller's counters as ``rollout/*`` (totals since the start, and gauges now)."""
        rollout = {
            "committed_total": stats.committed,
            "selected_total": stats.selected,
            "evicted_total": stats.evicted,
            "aborted_total": stats.aborted,
            "redispatch_total": stats.redispatched,
            "infra_failures_total": stats.infra_failures,
            "data_failures_total": stats.data_failures,
            "dropped_total": stats.dropped,
            "replaced_total": stats.replaced,
            "promoted_total": stats.promoted,
            "inflight": stats.inflight,
            "buffered": stats.buffered,
            "idle_s": stats.idle_s,
        }
        pl_module.log_dict({f"rollout/{k}": float(v) for k, v in rollout.items()}, on_step=True, batch_size=1)
