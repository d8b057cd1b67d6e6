"""Async vs sync steps/s on the tiny model, with long-tailed generation lengths, against the ideal overlap bound.

Generation lengths: `builtin:tiny` without its warm start stops at a random token, so completion lengths are
roughly geometric up to `max_new_tokens` — a long tail. Three runs of the same number of RL steps, one process
each time, the in-process data plane, the engine in a Ray actor (its own process), torch at one intra-op thread:

  sync       in_order, max_lookahead_versions 0: generation and training alternate
  async      in_order, max_lookahead_versions 1: the next step's groups generate while this step trains
  drain      async with the drain gate (in_flight_weight_updates: false): each refit waits for the groups in
             flight, so none spans two weight versions
  windowed   windowed, max_staleness_versions 1, streamed chunks of >= 2 groups
  capped     windowed with over_sampling_ratio 1: dispatch at most (S + 1) batches ahead of the trainer
  capped-1/4 capped with chunks of >= 1 / 4 groups (one group, and whole steps)

From the sync run: S = median step time, G = median time the trainer waits for rollouts per step, and
T = S - G = everything else the trainer does per step (training, refit/weight sync, dispatch and bookkeeping), all
of which stays on the trainer's critical path in every mode. Perfect overlap hides generation behind that work, so
the ideal step is max(G, T) and the bound is S / max(G, T) = (G + T) / max(G, T). The table reports each run's
median step time, its speed-up over sync and that speed-up as a fraction of the bound, and the engine's wasted
completion tokens (goodput: evicted, aborted or failed groups') as a share of all it generated whose fate is known.
Target (benchmarks/README.md, "Async vs sync"): async reaches >= 90% of the bound.

    python benchmarks/async_vs_sync.py [--steps 40] [--max-new-tokens 24] [--modes async windowed ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer

from sc_lightning.callbacks.monitor import RolloutMonitor
from sc_lightning.callbacks.refit import RefitCallback
from sc_lightning.config import load_config
from sc_lightning.config.yaml_io import load_yaml_layers
from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.lightning.strategy import SingleControllerStrategy

TINY = Path(__file__).resolve().parent.parent / "configs" / "grpo_tiny.yaml"
# every mode: 4 groups x 4 generations per step, the engine in its own Ray actor
SHAPE = [
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=16",
    "policy.generation.colocated.enabled=false",
    "async_rl.min_groups_for_streaming_train=4",
]
MODES = {
    "sync": [
        "async_rl.sampler.max_lookahead_versions=0",
        "async_rl.max_buffered_rollouts=4",
        "async_rl.max_inflight_prompts=4",
    ],
    "async": [
        "async_rl.sampler.max_lookahead_versions=1",
        "async_rl.max_buffered_rollouts=8",
        "async_rl.max_inflight_prompts=8",
    ],
    "drain": [
        "async_rl.sampler.max_lookahead_versions=1",
        "async_rl.max_buffered_rollouts=8",
        "async_rl.max_inflight_prompts=8",
        "async_rl.in_flight_weight_updates=false",
    ],
    "windowed": [
        "async_rl.sampler.name=windowed",
        "async_rl.sampler.max_staleness_versions=1",
        "async_rl.max_buffered_rollouts=8",
        "async_rl.max_inflight_prompts=8",
        "async_rl.min_groups_for_streaming_train=2",
    ],
}
MODES["capped"] = [*MODES["windowed"], "async_rl.sampler.over_sampling_ratio=1"]
# other chunk sizes, for comparison (see benchmarks/README.md, "Streaming chunks")
MODES["capped-1"] = [*MODES["capped"], "async_rl.min_groups_for_streaming_train=1"]
MODES["capped-4"] = [*MODES["capped"], "async_rl.min_groups_for_streaming_train=4"]


class StepTimes(Callback):
    """Collects the per-step timing metrics the module and the rollout monitor log, and the engine's token goodput."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.tokens = {"wasted": 0, "trained": 0}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Keep this step's timings."""
        metrics = trainer.callback_metrics
        names = ("total_step_time", "exposed_generation", "policy_training", "weight_sync")
        row = {n: float(metrics[f"timing/train/{n}"]) for n in names if f"timing/train/{n}" in metrics}
        # below 1 on a window of 1: the step took groups of the batch dispatched for the next step
        row["staleness_mean"] = float(metrics["train/staleness_mean"])
        self.rows.append(row)
        engine = trainer.strategy.rollout_side.controller.stats().engine_time
        self.tokens = {"wasted": engine.wasted_tokens, "trained": engine.trained_tokens}


def run(mode: str, steps: int, max_new_tokens: int) -> dict[str, float]:
    """Train ``steps`` RL steps in ``mode``; median step time, exposed generation and training time."""
    overrides = [
        "data_plane.backend=memory",
        "policy.model_name=builtin:tiny",
        f"policy.generation.max_new_tokens={max_new_tokens}",
        f"grpo.max_num_steps={steps}",
        *SHAPE,
        *MODES[mode],
    ]
    config = load_config(load_yaml_layers([TINY], overrides), extra_top_level=("trainer", "seed_everything"))

    def engine(config, weights):
        # its own process: the tiny model is Python-bound, so a thread would only contend for the GIL
        return RayMegatronEngine("builtin:tiny", seed=config.algo.seed, max_seq_len=32)

    times = StepTimes()
    trainer = Trainer(
        strategy=SingleControllerStrategy(config, engine),
        callbacks=[RefitCallback(), RolloutMonitor(), times],
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(GRPOModule(config))
    rows = times.rows[3:]  # skip warm-up steps
    medians = {key: statistics.median(r[key] for r in rows if key in r) for key in rows[-1]}
    return {**medians, "wasted_share": times.tokens["wasted"] / max(1, sum(times.tokens.values()))}


def main() -> None:
    """Run every mode and print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="sync always runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    modes = ["sync", *(m for m in args.modes if m != "sync")]
    results = {mode: run(mode, args.steps, args.max_new_tokens) for mode in modes}
    sync = results["sync"]
    g = sync["exposed_generation"]
    t = sync["total_step_time"] - g  # training + refit + overhead: serial in every mode
    bound = (g + t) / max(g, t)
    print(
        f"sync: G = {g * 1e3:.1f} ms exposed generation, T = {t * 1e3:.1f} ms other trainer work per step "
        f"(training {sync['policy_training'] * 1e3:.1f} ms, weight sync {sync['weight_sync'] * 1e3:.1f} ms); "
        f"ideal overlap bound (G+T)/max(G,T) = {bound:.2f}x"
    )
    header = f"{'mode':<10} {'step ms':>8} {'speed-up':>9} {'of bound':>9} {'wasted':>7}"
    print(header + f" {'G ms':>6} {'train':>6} {'sync':>6} {'stale':>6}")
    for mode, r in results.items():
        speedup = sync["total_step_time"] / r["total_step_time"]
        row = f"{r['total_step_time'] * 1e3:8.1f} {speedup:8.2f}x {speedup / bound:8.0%} {r['wasted_share']:6.1%}"
        row += "".join(f" {r[k] * 1e3:6.1f}" for k in ("exposed_generation", "policy_training", "weight_sync"))
        row += f" {r['staleness_mean']:6.2f}"
        print(f"{mode:<10} {row}")
    print(f"measured {time.strftime('%Y-%m-%d')}, {torch.get_num_threads()} torch thread(s)")


if __name__ == "__main__":
    main()
