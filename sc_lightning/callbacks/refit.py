"""RefitCallback: after every RL step, push the policy's new weights to the generation engine.

on_train_batch_end (the optimizer step is done, global_step = v): ``trainer.strategy.rollout_side.refit(v)``
    begin_refit(v)     close dispatch; abort in-flight rollouts that can never be trained; with the drain gate
                       (async_rl.in_flight_weight_updates: false) wait for the rest to finish; release the step's rows
    push_weights(v)    export the policy under HF names and load it into the engine, in buckets of bounded size
                       (the engine adopts v with the last); skipped while a PPO critic warm-up leaves the policy
                       unchanged (the module's ``policy_trained`` is False)
    finish_refit(v)    new rollouts are stamped with version v; dispatch reopens

The rollout side records the refit (``rollout_side.last_refit``);
:class:`~sc_lightning.callbacks.monitor.RolloutMonitor` logs it.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class RefitCallback(Callback):
    """Syncs weights to the engine after each RL step.

    When the strategy's engine is colocated (``policy.generation.colocated.enabled``), the engine also stands down
    for each train step and wakes with the refit.
    """

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Colocated: the engine stands down for the whole train step (its requests and deadlines freeze); under the
        drain gate, once the rollouts in flight have finished."""
        side = trainer.strategy.rollout_side
        if side.colocated:
            side.stand_down_engine()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Refit the engine to the weights the step just produced."""
        side = trainer.strategy.rollout_side
        side.refit(trainer.global_step, trained=pl_module.policy_trained, wake=side.colocated)
