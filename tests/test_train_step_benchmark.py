"""benchmarks/train_step.py on CPU ranks: its TP = 2 layout trains the very step TP = 1 does, and DP replicas time a
step of their own rows (issue 41's TP and DP figures come from this script under torchrun on GPUs)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # three launches of the benchmark, two of them two ranks under torchrun

TINY = ("--layers", "2", "--hidden", "128", "--heads", "4", "--groups", "2", "--ffn", "256", "--vocab", "512")
ARGS = ("benchmarks/train_step.py", *TINY, "--seq", "64", "--rows", "4", "--reps", "1")
FIRST_STEP = re.compile(r"first GRPO step: loss (\S+) grad_norm (\S+)")


def benchmark(*extra: str, ranks: int = 1) -> str:
    """The benchmark's output on ``ranks`` CPU processes (torchrun, on a free port, for more than one)."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks > 1 else []
    done = subprocess.run(
        [sys.executable, *launcher, *ARGS, *extra], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def first_step(output: str) -> tuple[float, float]:
    """The loss and gradient norm of the first GRPO step the benchmark printed."""
    match = FIRST_STEP.search(output)
    assert match, output
    return float(match.group(1)), float(match.group(2))


def test_tensor_parallel_ranks_train_the_step_one_rank_trains_and_replicas_train_their_own_rows() -> None:
    one, tensor_parallel, data_parallel = benchmark(), benchmark("--tp", "2", ranks=2), benchmark(ranks=2)
    assert "TP 2 x PP 1 x DP 1" in tensor_parallel and "TP 1 x PP 1 x DP 2" in data_parallel
    assert first_step(tensor_parallel) == pytest.approx(first_step(one), rel=1e-5)  # the same rows, split layers
    assert first_step(data_parallel) != pytest.approx(first_step(one), rel=1e-3)  # each replica's rows: another step
    assert all("| sc_lightning GRPO |" in output for output in (one, tensor_parallel, data_parallel))
