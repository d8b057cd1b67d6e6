"""What validation every 10 steps costs the tiny example, and whether it still learns.

Two fits of configs/grpo_tiny.yaml in one invocation, one process each (as users run it, through the CLI): without
validation, then with ``grpo.val_period: 10`` (the builtin arithmetic validation set: 100 prompts, one completion
each, ``val_batch_size`` 8 at once beside the rollouts). From each run's metrics.csv: the median RL step time
(``timing/train/total_step_time``), the training reward of the first and last 50 steps, and, with validation, the
``val/reward`` of the first and last validations. Targets (issue 20): step time with validation <= 1.15x without;
the reward climbs by >= 0.3 as before; ``val/reward`` climbs.

    python benchmarks/validation_overhead.py [--steps 1000] [--val-period 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def fit(root: Path, steps: int, val_period: int) -> list[dict[str, str]]:
    """Run the tiny example for ``steps`` steps (validating every ``val_period``; 0 = never); its CSV rows."""
    command = [
        sys.executable,
        "-m",
        "sc_lightning",
        "fit",
        "--config",
        str(REPO / "configs" / "grpo_tiny.yaml"),
        "--grpo.max_num_steps",
        str(steps),
        "--grpo.val_period",
        str(val_period),
        f"--trainer.default_root_dir={root}",
        "--trainer.enable_progress_bar=false",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    (root / "stderr.txt").write_text(done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"the fit in {root} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    (metrics,) = root.glob("lightning_logs/version_*/metrics.csv")
    return list(csv.DictReader(metrics.open()))


def summary(rows: list[dict[str, str]]) -> dict[str, float]:
    """Median step time, first/last-50-step training reward, first/last val/reward (nan without validation)."""
    steps = [row for row in rows if row.get("timing/train/total_step_time")]
    rewards = [float(row["train/reward"]) for row in rows if row.get("train/reward")]
    val = [float(row["val/reward"]) for row in rows if row.get("val/reward")]
    return {
        "median_step_s": statistics.median(float(row["timing/train/total_step_time"]) for row in steps),
        "reward_first50": statistics.fmean(rewards[:50]),
        "reward_last50": statistics.fmean(rewards[-50:]),
        "val_first": val[0] if val else float("nan"),
        "val_last": val[-1] if val else float("nan"),
        "validations": float(len(val)),
    }


def main() -> None:
    """Run both fits and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--val-period", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        plain = summary(fit(out / "plain", args.steps, 0))
        validated = summary(fit(out / "validated", args.steps, args.val_period))
    print(f"{'run':<12}{'median step s':>15}{'reward first50':>16}{'last50':>8}{'val first':>11}{'val last':>10}")
    for name, row in (("no val", plain), (f"val/{args.val_period}", validated)):
        print(
            f"{name:<12}{row['median_step_s']:>15.3f}{row['reward_first50']:>16.3f}{row['reward_last50']:>8.3f}"
            f"{row['val_first']:>11.3f}{row['val_last']:>10.3f}"
        )
    ratio = validated["median_step_s"] / plain["median_step_s"]
    climb = validated["reward_last50"] - validated["reward_first50"]
    print(f"step time ratio (val / no val): {ratio:.3f}x (target <= 1.15x)")
    print(f"reward climb with validation: {climb:+.3f} (target >= +0.3); validations: {int(validated['validations'])}")


if __name__ == "__main__":
    main()
