"""RolloutMonitor: logs each RL step's refit, step time and the controller's rollout counters.

Per step, after the refit that :class:`~sc_lightning.callbacks.refit.RefitCallback` ran (read from
``trainer.strategy.rollout_side.last_refit``):

    timing/train/weight_sync        the refit's wall time (release, weight export and push, reopen)
    timing/train/total_step_time    from the previous refit's end (or the fit's start) to this one's; also the
                                    progress bar's ``step_s``
    train/aborted_stale_inflight_groups, train/{dropped,replaced,promoted}_prompt_groups    this step's
    dynamic_sampling/filtered_groups, dynamic_sampling/extra_generations    this step's (grpo.use_dynamic_sampling);
                                    the filtered groups also go to train_data.jsonl, before the step's bundle
    rollout/*_total                 counters since the run's start (the callback's state, saved in every bundle's
                                    trainer.ckpt: a resumed run continues them); rollout/inflight,
                                    rollout/buffered, rollout/idle_s gauges as dispatch reopened
    survivorship/{trained,committed,evicted}_{groups,reward_mean,len_mean}
                                    this step's groups taken for training, committed and evicted by the sampler:
                                    their count, mean reward and mean completion length (0 for none)
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from sc_lightning.controller.api import ControllerStats, StepSurvivorship
from sc_lightning.lightning.module import GRPOModule


class RolloutMonitor(Callback):
    """Logs the refit's and the step's times, the step's drops and ``rollout/*``; list it after RefitCallback."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}  # the run's rollout/*_total counters as of the last step
        self._resumed: dict[str, float] = {}  # those of the bundle this process resumed from

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Log the refit of the step that just ended (on the leader rank: the others run no refit)."""
        if not trainer.is_global_zero:
            return
        record = trainer.strategy.rollout_side.last_refit
        if record is None or record.version != trainer.global_step:
            raise MisconfigurationException(
                f"RolloutMonitor found no refit for RL step {trainer.global_step - 1}: list it after RefitCallback "
                "in Trainer(callbacks=[...])"
            )
        log = pl_module.step_log
        log.log(trainer, {"timing/train/weight_sync": record.duration_s, "timing/train/total_step_time": record.step_s})
        pl_module.log("step_s", record.step_s, prog_bar=True, logger=False, on_step=True, batch_size=1)
        stats = record.report.stats
        step = {
            "aborted_stale_inflight_groups": record.report.aborted,
            "dropped_prompt_groups": stats.last_step.dropped,
            "replaced_prompt_groups": stats.last_step.replaced,
            "promoted_prompt_groups": stats.last_step.promoted,
        }
        log.log(trainer, {f"train/{k}": v for k, v in step.items()})
        filtering = {
            "dynamic_sampling/filtered_groups": float(len(stats.last_step.filtered)),
            "dynamic_sampling/extra_generations": float(stats.last_step.extra_generations),
        }
        log.log(trainer, filtering)
        if isinstance(pl_module, GRPOModule):  # before the step's bundle: Lightning runs checkpoint callbacks last
            pl_module.log_filtered_groups(record.version - 1, stats.last_step.filtered)
        counters = rollout_counters(stats)
        self.totals = {k: self._resumed.get(k, 0.0) + v for k, v in counters.items() if k.endswith("_total")}
        log.log(trainer, {f"rollout/{k}": v for k, v in (counters | self.totals).items()})
        log.log(trainer, {f"survivorship/{k}": v for k, v in survivorship_metrics(stats.survivorship).items()})

    def state_dict(self) -> dict[str, Any]:
        """The run's ``rollout/*_total`` counters as of the last step (saved in each bundle's ``trainer.ckpt``)."""
        return {"totals": dict(self.totals)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the counters of the bundle the run resumes from (the controller's restart with the process)."""
        self.totals = self._resumed = {name: float(value) for name, value in state_dict["totals"].items()}


def survivorship_metrics(step: StepSurvivorship) -> dict[str, float]:
    """One step's cohorts under their ``survivorship/*`` names."""
    return {
        f"{kind}_{name}": float(getattr(getattr(step, kind), name))
        for kind in ("trained", "committed", "evicted")
        for name in ("groups", "reward_mean", "len_mean")
    }


def rollout_counters(stats: ControllerStats) -> dict[str, float]:
    """The controller's counters under their ``rollout/*`` names: totals since the start, and gauges now."""
    return {
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
        "filtered_total": stats.filtered,
        "extra_generations_total": stats.extra_generations,
        "inflight": stats.inflight,
        "buffered": stats.buffered,
        "idle_s": stats.idle_s,
    }
