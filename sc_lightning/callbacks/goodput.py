"""GoodputMonitor: where each fleet's time went, per RL step and in total, and what would have balanced them.

Each RL step's window runs from the previous step's end (after its refit) to this one's. The trainer's window is
split into

    productive      training_step: forward, backward, optimizer (``timing/train/policy_training``)
    wait_rollouts   waiting for the step's groups (``timing/train/exposed_generation``)
    refit           the weight update after the step
    checkpoint      writing the bundle of the previous step (BundleCheckpoint runs after the other callbacks)
    other           the rest of the window (Lightning's loop, logging, callbacks)

and the engine fleet's accounts (:class:`~sc_lightning.rollout.goodput.EngineTime`, kept by the rollout side) into
trained, wasted, pending, stood_down and idle. Logged as ``goodput/<fleet>/<part>_s`` (the account's change over the
step: ``pending`` may fall, its time moving to ``trained``) and
``goodput/<fleet>/<part>_total_s`` (since the start; ``goodput/<fleet>/wall_total_s`` their sum), with
``goodput/engine/{trained,wasted}_tokens_total``; a distillation run's teachers are a fleet of their own,
``goodput/teacher/<alias>/{busy,idle}_total_s`` and ``scored_tokens_total`` (since this process began: a resumed run
starts them again; :class:`~sc_lightning.rollout.teachers.TeacherTime`). The progress bar shows ``tok_s``, the
step's trained completion tokens per second. At the end of the fit the leader prints
:func:`~sc_lightning.trainer.goodput.allocation_advice` (``report`` prints it too, from the logged totals).

From the same window, the step's throughput (:func:`~sc_lightning.trainer.perf.step_throughput`):
``perf/tokens_per_s_per_gpu`` (NeMo-RL's: prompt + response tokens / step wall time / the run's GPUs),
``perf/generated_tokens_per_s``, ``perf/step_tokens``, ``perf/step_generated_tokens`` and the split
``perf/split_{generation,logprob,train,refit,other}_s``, which adds up to the wall time. Where the engines count
their decode steps (the Megatron engine: :mod:`~sc_lightning.engines.decode_counters`), how full their batch was:
``perf/decode_steps`` of the window, ``perf/decode_rows_mean`` (rows decoding together, on average),
``perf/decode_slots`` (the rows their KV caches hold) and ``perf/decode_preemptions`` (rows a paged KV cache short
of blocks sent back to compute their prefix again).

The totals are the run's, not the process's: they are the callback's state, which Lightning saves in every bundle's
``trainer.ckpt``, so a resumed run continues them from the bundle's step (the engines' accounts restart with the
process, and are added to the bundle's).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from sc_lightning.callbacks.checkpoint import BundleCheckpoint
from sc_lightning.config import SCConfig
from sc_lightning.config.samplers import SamplerConfig
from sc_lightning.engines.decode_counters import DecodeCounters
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.rollout.goodput import EngineTime
from sc_lightning.trainer.goodput import LOOKAHEAD_KNOB, TRAINER_PARTS, allocation_advice
from sc_lightning.trainer.perf import StepWork, step_throughput


class GoodputMonitor(Callback):
    """Logs ``goodput/*`` for both fleets and the step's ``perf/tokens_per_s_per_gpu`` and split each RL step, and
    ``tok_s`` on the progress bar; list it after RefitCallback. ``devices``: (generation, training) device counts of
    a non-colocated run, for the advice and the GPU count (None: the trainer's world size); ``off_policy``: whether
    the run's sampler lets generation run ahead of the trainer, and ``lookahead_knob`` its knob for that, for the
    advice (None: not said)."""

    def __init__(
        self,
        devices: tuple[int, int] | None = None,
        off_policy: bool | None = None,
        lookahead_knob: str = LOOKAHEAD_KNOB,
    ) -> None:
        self.devices = devices
        self.off_policy, self.lookahead_knob = off_policy, lookahead_knob
        self.trainer_totals = dict.fromkeys(TRAINER_PARTS, 0.0)
        self.engine = EngineTime()  # the run's engine totals as of the last step
        self.steps = 0
        self._resumed_engine = EngineTime()  # the engine totals of the bundle this process resumed from
        self._checkpoint_s = 0.0
        self._decode = DecodeCounters()  # the engines' decode counters at the last step (this process's engines)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Split the step's window and the engines' time since the last step; log both (on the leader)."""
        if not trainer.is_global_zero:
            return
        record = trainer.strategy.rollout_side.last_refit
        if record is None:
            return  # RolloutMonitor names the missing refit
        step = self._trainer_window(trainer, record.step_s, record.duration_s)
        engine = self._resumed_engine + record.report.stats.engine_time
        engine_step = {name: now - self.engine.parts()[name] for name, now in engine.parts().items()}
        trained_tokens = engine.trained_tokens - self.engine.trained_tokens
        self.engine = engine
        self.steps += 1
        logged = {f"goodput/trainer/{part}_s": seconds for part, seconds in step.items()}
        logged |= {f"goodput/trainer/{part}_total_s": seconds for part, seconds in self.trainer_totals.items()}
        logged["goodput/trainer/wall_total_s"] = sum(self.trainer_totals.values())
        logged |= {f"goodput/engine/{part}_s": seconds for part, seconds in engine_step.items()}
        logged |= {f"goodput/engine/{part}_total_s": seconds for part, seconds in engine.parts().items()}
        logged["goodput/engine/wall_total_s"] = engine.wall_s
        logged["goodput/engine/trained_tokens_total"] = float(engine.trained_tokens)
        logged["goodput/engine/wasted_tokens_total"] = float(engine.wasted_tokens)
        teachers = trainer.strategy.rollout_side.teachers  # distillation: the teachers' fleet, since this process began
        for alias, teacher in (teachers.snapshot() if teachers is not None else {}).items():
            logged |= {f"goodput/teacher/{alias}/busy_total_s": teacher.busy_s}
            logged |= {f"goodput/teacher/{alias}/idle_total_s": teacher.idle_s}
            logged |= {f"goodput/teacher/{alias}/scored_tokens_total": float(teacher.scored_tokens)}
        work = pl_module.step_work if isinstance(pl_module, GRPOModule) else None
        gpus = sum(self.devices) if self.devices is not None else trainer.world_size
        perf = step_throughput(step, work or StepWork(0, 0.0), trained_tokens, gpus)
        logged |= {f"perf/{name}": value for name, value in perf.items()}
        if (decode := record.decode) is not None:  # engines that count their decode steps
            logged |= {f"perf/{name}": value for name, value in decode.since(self._decode).items()}
            self._decode = decode
        pl_module.step_log.log(trainer, logged)
        wall = sum(step.values())
        pl_module.log("tok_s", trained_tokens / wall if wall > 0 else 0.0, prog_bar=True, logger=False, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        """The run's totals as of the last step (saved in each bundle's ``trainer.ckpt``)."""
        return {"steps": self.steps, "trainer": dict(self.trainer_totals), "engine": asdict(self.engine)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the totals of the bundle the run resumes from."""
        self.steps = int(state_dict["steps"])
        self.trainer_totals = {part: float(state_dict["trainer"].get(part, 0.0)) for part in TRAINER_PARTS}
        self.engine = self._resumed_engine = EngineTime(**state_dict["engine"])

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print the run's goodput and the allocation advice (the leader)."""
        if trainer.is_global_zero and self.steps:
            advice = allocation_advice(
                self.trainer_totals, self.engine, self.steps, self.devices, self.off_policy, self.lookahead_knob
            )
            rank_zero_info(advice)

    def _trainer_window(self, trainer: Trainer, wall: float, refit_s: float) -> dict[str, float]:
        """The trainer's parts of the step's window, ``wall`` seconds long (added to the totals)."""
        metrics = trainer.callback_metrics
        saved = sum(c.total_save_s for c in trainer.checkpoint_callbacks if isinstance(c, BundleCheckpoint))
        step = {
            "productive": float(metrics.get("timing/train/policy_training", 0.0)),
            "wait_rollouts": float(metrics.get("timing/train/exposed_generation", 0.0)),
            "refit": refit_s,
            "checkpoint": saved - self._checkpoint_s,
        }
        self._checkpoint_s = saved
        step["other"] = max(0.0, wall - sum(step.values()))  # clock reads a few microseconds apart
        for part, seconds in step.items():
            self.trainer_totals[part] += seconds
        return step


def fleet_devices(config: SCConfig, training_devices: int) -> tuple[int, int] | None:
    """The (generation, training) device counts of a run whose engines have their own GPUs (None: colocated, or
    generation devices not configured, e.g. a CPU run)."""
    generation = config.policy.generation.colocated
    if generation.enabled or generation.resources.gpus_per_node is None:
        return None
    return generation.resources.num_nodes * generation.resources.gpus_per_node, training_devices


def lookahead_of(sampler: SamplerConfig) -> tuple[bool | None, str]:
    """Whether ``sampler`` lets training take groups of older weights, and the dotpath of its knob for that (the
    mode's ``max_lookahead_versions`` or ``max_staleness_versions``), for the advice; a custom sampler has neither,
    its class decides: unknown, and the default sampler's knob."""
    knob = next((k for k in ("max_lookahead_versions", "max_staleness_versions") if hasattr(sampler, k)), None)
    if knob is None:
        return None, LOOKAHEAD_KNOB
    return sampler.is_off_policy(), f"async_rl.sampler.{knob}"
