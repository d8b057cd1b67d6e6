"""benchmarks/e2e.py at the tiny shape: the real fit, its throughput figures, and its parts timed on the same work."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sc_lightning.trainer.perf import SPLIT
from tests.helpers.cli import user_environment
from tests.helpers.configs import REPO

pytestmark = pytest.mark.slow  # two fits and their parts' benchmarks on the CPU (about a minute each)


@pytest.mark.parametrize("mode", ["colocated", "async"])
def test_the_e2e_benchmark_reports_the_fits_throughput_and_times_the_same_work(tmp_path: Path, mode: str) -> None:
    command = [sys.executable, "benchmarks/e2e.py", "--shape", "tiny", "--mode", mode, "--out", str(tmp_path)]
    command += ["--profile-train"] if mode == "colocated" else []
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400, env=user_environment())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "orchestration efficiency =" in result.stdout and "tokens/s/GPU" in result.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    summary, last, parts = results["summary"], results["last_step"], results["components"]
    assert summary["steps"] == 2  # 3 steps, the first left out as warm-up
    assert sum(summary[f"split_{part}_s"] for part in SPLIT) == pytest.approx(summary["step_s"], rel=0.02)
    # NeMo-RL's figure: prompt + response tokens / step time / GPUs (one CPU device): 16 rows of a 16-token prompt
    assert summary["tokens_per_s_per_gpu"] == pytest.approx(summary["step_tokens"] / summary["step_s"], rel=0.02)
    assert summary["step_tokens"] >= 16 * (16 + 1)
    # the parts were timed on the last step's very work: the same answer lengths the fit generated
    lengths = results["answer_lengths"]
    assert len(lengths) == 16 and sum(lengths) == last["perf/step_generated_tokens"]
    assert last["perf/step_tokens"] == sum(lengths) + 16 * 16
    assert all(parts[f"{part}_s"] > 0 for part in ("generation", "train", "train_cold", "refit"))
    explained = parts["generation_s"] + parts["train_s"] + parts["refit_s"]
    assert results["efficiency"] == pytest.approx(explained / last["timing/train/total_step_time"])
    # the engine's batch (counted in this process's engine, or in its actor by a call): rows decoding together over
    # the measured steps (async: the last step's window may hold no decode step, its groups sampled a step ahead)
    assert 0 < summary["decode_rows_mean"] <= summary["decode_slots"] == 16
    assert "rows at a time on average" in result.stdout
    # no CUDA graph on the CPU: the captures are logged every step, and none happened (nothing printed of them)
    assert summary["decode_graph_captures"] == last["perf/decode_graph_captures"] == 0
    assert "as CUDA graphs" not in result.stdout
    if mode == "colocated":  # on-policy: every token it sampled in the step's window was trained
        sampled = last["perf/decode_rows_mean"] * last["perf/decode_steps"]
        assert sampled == pytest.approx(last["perf/step_generated_tokens"])
        # --profile-train: the fit's last training step (a callback in the fit's process) and the parts' one, the
        # same micro-batches of the same rows: the model's matrix products ran as often in both
        fit, own = results["fit_train_profile"], parts["train_profile"]
        assert 0 < fit["wall_s"] < last["timing/train/total_step_time"] and own["wall_s"] > 0
        assert fit["calls"]["aten::mm"] == own["calls"]["aten::mm"] > 0
        assert "the fit's training step 2, profiled" in result.stdout


def test_colocated_async_decodes_the_next_steps_prompts_across_the_refit(tmp_path: Path) -> None:
    """One process, one step of lookahead: every step after the first trains groups started a version earlier, and
    some of their tokens were sampled after the refit (per-token versions); --no-parts times nothing else."""
    command = [sys.executable, "benchmarks/e2e.py", "--shape", "tiny", "--mode", "colocated-async", "--steps", "4"]
    command += ["--no-parts", "--out", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400, env=user_environment())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "mode colocated-async" in result.stdout and "orchestration efficiency" not in result.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert "components" not in results and results["summary"]["steps"] == 3
    config = yaml.safe_load((tmp_path / "e2e.yaml").read_text())
    assert config["policy"]["generation"]["colocated"]["enabled"] is True
    assert config["async_rl"]["sampler"]["max_lookahead_versions"] == 1
    (metrics,) = (tmp_path / "run").glob("lightning_logs/version_*/metrics.csv")
    steps = [row for row in csv.DictReader(metrics.open()) if row.get("train/staleness_mean")]
    assert [float(row["train/staleness_mean"]) for row in steps] == [0.0, 1.0, 1.0, 1.0]
    assert any(0.0 < float(row["train/token_staleness_mean"]) < 1.0 for row in steps[1:])


def test_a_multi_gpu_split_run_puts_a_replica_on_each_engine_gpu_and_trainer_ranks_on_transferqueue(
    tmp_path: Path,
) -> None:
    """--config-only validates and prints the fit's config: M data-parallel trainer ranks (reading the TransferQueue
    data plane) and an engine replica on each of N GPUs, the split run issue 41 measures on 4-8 GPUs; the parts'
    benchmarks, one GPU's, refuse to come along; an invalid config ends the benchmark before its fit."""
    base = [sys.executable, "benchmarks/e2e.py", "--shape", "llama1b", "--mode", "async", "--out", str(tmp_path)]
    split = ["--trainer-devices", "4", "--engine-gpus", "4"]
    result = subprocess.run(
        [*base, *split, "--no-parts", "--config-only"], cwd=REPO, capture_output=True, text=True, timeout=120,
        env=user_environment(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load(result.stdout)
    assert config["trainer"]["devices"] == 4 and config["data_plane"]["backend"] == "simple"
    assert config["policy"]["generation"]["colocated"] == {
        "enabled": False,
        "resources": {"num_nodes": 1, "gpus_per_node": 4},
    }
    refused = subprocess.run([*base, *split], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "need --no-parts" in refused.stderr
    invalid = subprocess.run(  # a config the product refuses fails before any fit starts, naming the knob
        [*base, "--engine-batch", "0", "--no-parts", "--config-only"], cwd=REPO, capture_output=True, text=True,
        timeout=120, env=user_environment(),
    )  # fmt: skip
    assert invalid.returncode == 1 and "mcore_generation_config.max_batch_size: must be >= 1" in invalid.stderr
