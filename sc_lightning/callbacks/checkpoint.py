"""BundleCheckpoint: every ``checkpointing.save_period`` RL steps, and at the end of every fit, write a whole bundle.

However a fit ends — ``max_num_steps``, ``trainer.max_time``, ``trainer.limit_train_batches``, the rollouts running
out, a stop signal (:mod:`~sc_lightning.callbacks.stop`), a callback's ``trainer.should_stop`` — the bundle of its
last finished step is written at ``on_train_end``, while the rollout side still runs; the same command resumes from
it. (A fit that ends by an error, or by a second Ctrl-C, writes none: its step was not finished.)

It is a Lightning :class:`~lightning.pytorch.callbacks.Checkpoint`, so Lightning runs it after every other callback:
after the step's refit (:class:`~sc_lightning.callbacks.refit.RefitCallback`), when no selected group is left
untrained, whatever the registration order. The bundle's trainer state and controller state describe the same
moment. (Being a checkpoint callback, it needs the Trainer's ``enable_checkpointing`` left on, its default.)
Writing goes through :func:`~sc_lightning.checkpoint.atomic.write_atomically` (temporary directory, manifest,
fsync, rename), so a crash during a write leaves the previous bundles as they were. Generation goes on during the
write; commits wait at the buffer's barrier only while the data plane is being snapshotted. With
``checkpointing.metric_name`` each bundle records that metric (a train metric of its step, or the newest validation
metric at or before it), and ``keep_top_k`` then removes the bundles outside the best K (never the newest: see
:mod:`~sc_lightning.checkpoint.retention`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint

from sc_lightning.callbacks.validation import ValidationMonitor
from sc_lightning.checkpoint.atomic import is_intact, write_atomically
from sc_lightning.checkpoint.bundle import DATA_PLANE_DIR, TRAINER_FILE, bundle_name, write_controller_files
from sc_lightning.checkpoint.retention import bundles_beyond_top_k, remove_bundle, write_ranking
from sc_lightning.config.runtime import CheckpointingConfig


class BundleCheckpoint(Checkpoint):
    """Writes ``checkpoint_dir/step_N`` bundles (trainer, controller, data plane); logs their write time."""

    def __init__(self, config: CheckpointingConfig, *, max_steps: int) -> None:
        self.config = config
        self.max_steps = max_steps
        self.saved: list[Path] = []
        self.total_save_s = 0.0  # seconds spent writing bundles (GoodputMonitor's checkpoint part)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Save when the step count is a multiple of save_period, or training is about to stop."""
        step = trainer.global_step
        if step % self.config.save_period == 0 or step >= self.max_steps:
            started = time.monotonic()
            self.save(trainer, step)
            seconds = time.monotonic() - started
            self.total_save_s += seconds
            pl_module.step_log.log(trainer, {"timing/train/checkpointing": seconds})

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """However the fit ended, the bundle of its last finished step (kept as is when it exists already)."""
        if trainer.global_step > 0:
            started = time.monotonic()
            self.save(trainer, trainer.global_step)
            self.total_save_s += time.monotonic() - started

    def save(self, trainer: Trainer, step: int) -> Path:
        """Write the bundle of ``step`` (a bundle that exists already, e.g. the one resumed from, is kept as is; a
        damaged one is moved aside and written again).

        With several trainer ranks every rank calls this: the leader writes the bundle, and every rank writes its
        shards of the models into the leader's temporary directory (see the strategy's ``save_checkpoint``).
        """
        final = Path(self.config.checkpoint_dir) / bundle_name(step)
        strategy, weights_only = trainer.strategy, not self.config.save_optimizer
        intact = trainer.is_global_zero and final.exists() and is_intact(final)
        if strategy.broadcast(intact):  # the leader's answer, so every rank takes the same branch
            return final
        if not trainer.is_global_zero:
            trainer.save_checkpoint(Path(strategy.broadcast(None)) / TRAINER_FILE, weights_only=weights_only)
            return final
        controller = strategy.rollout_side.controller
        with write_atomically(final) as directory:
            strategy.broadcast(str(directory))  # where the other ranks write their shards
            trainer.save_checkpoint(directory / TRAINER_FILE, weights_only=weights_only)
            rows = str(directory / DATA_PLANE_DIR) if self.config.save_data_plane else None
            state = controller.snapshot(rows)  # without rows, the buffered groups are listed to regenerate
            write_controller_files(directory, state)
            value = self._metric(trainer, step) if self.config.metric_name is not None else None
            if value is not None:
                write_ranking(directory, self.config.metric_name, value)
        self.saved.append(final)
        if self.config.keep_top_k is not None:
            for bundle in bundles_beyond_top_k(
                final.parent,
                keep_top_k=self.config.keep_top_k,
                metric_name=self.config.metric_name,
                higher_is_better=self.config.higher_is_better,
            ):
                remove_bundle(bundle)
        return final

    def _metric(self, trainer: Trainer, step: int) -> float | None:
        """The value of ``metric_name`` for the bundle of ``step``: ``train:<metric>`` names the logged
        ``train/<metric>`` of the step; ``val:<metric>`` the ``val/<metric>`` of the newest validation at or before
        it — its own step's, settled as the bundle's trainer state was written, at every save_period step — or None
        (the bundle is left unranked) when no validation has finished yet."""
        name = self.config.metric_name
        if name.startswith("val:"):
            return _validation_metric(trainer, name.removeprefix("val:"), step)
        key = "train/" + name.removeprefix("train:")
        value = trainer.callback_metrics.get(key)
        if value is None:
            logged = ", ".join(sorted(k for k in trainer.callback_metrics if k.startswith("train/")))
            raise KeyError(f"checkpointing.metric_name={name!r}: step {step} logged no {key!r}; use one of: {logged}")
        return float(value)


def _validation_metric(trainer: Trainer, metric: str, step: int) -> float | None:
    """``val/<metric>`` of the newest validation at or before ``step`` that the run's ValidationMonitor logged."""
    monitors = [c for c in trainer.callbacks if isinstance(c, ValidationMonitor)]
    results = [r for monitor in monitors for r in monitor.logged if r.step <= step]
    if not results:
        return None
    metrics = max(results, key=lambda result: result.step).metrics()
    if f"val/{metric}" not in metrics:
        names = ", ".join(f"val:{key.removeprefix('val/')}" for key in metrics)
        raise KeyError(
            f"checkpointing.metric_name='val:{metric}': validation logs no 'val/{metric}'; use one of: {names}"
        )
    return metrics[f"val/{metric}"]
