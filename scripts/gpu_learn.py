"""Helpers of scripts/gpu_learn.sh and scripts/gpu_long.sh: build a config's warm-started policy once, and print
the reward climb of runs.

python scripts/gpu_learn.py warm configs/grpo_1gpu.yaml   # the policy's warm start, on the config's device
python scripts/gpu_learn.py climb results/gpu_learn       # per run under it: steps, first/last-5 rewards, time
python scripts/gpu_learn.py summary metrics.csv --wall S  # one run: "first5 X last5 Y climb Z steps N wall S"
"""

from __future__ import annotations

import argparse
import csv
import logging
import time
from pathlib import Path


def warm(config_path: Path) -> None:
    """Build (or find cached) the warm start ``policy.model_name`` names, on the GPU when the trainer uses one."""
    import torch

    from sc_lightning.config import load_config
    from sc_lightning.config.yaml_io import load_yaml_layers
    from sc_lightning.models.warm_start import resolve_model_name

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the warm start's progress lines
    raw = load_yaml_layers([config_path])
    config = load_config(raw, extra_top_level=("trainer", "seed_everything"))  # the seed default included
    on_gpu = (raw.get("trainer") or {}).get("accelerator") in ("gpu", "cuda")
    device = "cuda" if on_gpu and torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    path = resolve_model_name(config.policy.model_name, seed=config.algo.seed, device=device)
    print(f"warm start {path} on {device}: {time.perf_counter() - start:.1f} s")


def _rewards_and_times(metrics: Path) -> tuple[list[float], list[float]]:
    """A run's reward and step time of every step, from its CSV metrics."""
    rows = list(csv.DictReader(metrics.open()))
    rewards = [float(row["train/reward"]) for row in rows if row.get("train/reward")]
    times = [float(row["timing/train/total_step_time"]) for row in rows if row.get("timing/train/total_step_time")]
    return rewards, times


def climb(root: Path) -> None:
    """For every run under ``root``: steps done, mean reward of the first and last 5 steps, their difference."""
    for metrics in sorted(root.glob("*/lightning_logs/version_*/metrics.csv")):
        rewards, times = _rewards_and_times(metrics)
        if len(rewards) < 10:
            print(f"{metrics.parents[2].name}: {len(rewards)} steps logged, too few to compare")
            continue
        first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
        tenths = [round(sum(part) / len(part), 3) for part in _tenths(rewards)]
        pace = f"{sum(times) / len(times):.3f} s/step" if times else "no step times"
        print(
            f"{metrics.parents[2].name}: {len(rewards)} steps, {pace}, "
            f"reward first-5 {first:.3f} last-5 {last:.3f} climb {last - first:+.3f}; by tenths {tenths}; "
            f"{_first_climb(rewards, times, first + 0.3)}"
        )


def summary(metrics: Path, wall: float) -> None:
    """One run's line ``first5 X last5 Y climb Z steps N wall S``, then its step time and rewards by tenths; a run
    with fewer than 10 steps logged (or none) says so and exits non-zero."""
    rewards, times = _rewards_and_times(metrics) if metrics.exists() else ([], [])
    if len(rewards) < 10:
        raise SystemExit(f"first5 - last5 - climb - steps {len(rewards)} wall {wall:.0f}: too few steps ({metrics})")
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"first5 {first:.3f} last5 {last:.3f} climb {last - first:+.3f} steps {len(rewards)} wall {wall:.0f}")
    pace = f"{sum(times) / len(times):.2f} s/step" if times else "no step times"
    tenths = [round(sum(part) / len(part), 3) for part in _tenths(rewards)]
    print(f"{pace}; reward by tenths {tenths}; {_first_climb(rewards, times, first + 0.3)}")


def _first_climb(rewards: list[float], times: list[float], target: float) -> str:
    """When the mean of 5 consecutive steps first reaches ``target`` (step, and training seconds until then)."""
    for end in range(5, len(rewards) + 1):
        if sum(rewards[end - 5 : end]) / 5 >= target:
            return f"5-step mean +0.3 first at step {end} ({sum(times[:end]):.0f} s of step time)"
    return "5-step mean never +0.3"


def _tenths(values: list[float]) -> list[list[float]]:
    size = max(1, len(values) // 10)
    return [values[i : i + size] for i in range(0, len(values), size)]


def main() -> None:
    """Parse ``warm CONFIG``, ``climb ROOT`` or ``summary METRICS --wall S`` and run it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("warm", "climb", "summary"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--wall", type=float, default=0.0, help="summary: the wall seconds to report")
    args = parser.parse_args()
    if args.command == "summary":
        summary(args.path, args.wall)
    else:
        (warm if args.command == "warm" else climb)(args.path)


if __name__ == "__main__":
    main()
