"""benchmarks/e2e.py's report of the measured steps from their metrics rows, without a fit: the figures a GPU run
prints that the CPU fit (tests/test_e2e_benchmark.py) never produces, such as the decode graph captures."""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

import pytest

from sc_lightning.trainer.perf import SPLIT
from tests.helpers.configs import REPO


@pytest.fixture
def e2e(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks/e2e.py as its script sees itself: its folder on sys.path, so its sibling modules import."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.delitem(sys.modules, "e2e", raising=False)
    import e2e

    return e2e


def row(step_s: float, captures: float, capture_s: float) -> dict[str, float]:
    """One step's metrics as the fit logs them on a GPU: 1,000 tokens, 800 generated, 100 decode steps."""
    split = {f"perf/split_{part}_s": step_s / len(SPLIT) for part in SPLIT}
    return split | {
        "timing/train/total_step_time": step_s,
        "perf/tokens_per_s_per_gpu": 1000 / step_s,
        "perf/step_tokens": 1000.0,
        "perf/step_generated_tokens": 800.0,
        "perf/decode_steps": 100.0,
        "perf/decode_rows_mean": 8.0,
        "perf/decode_slots": 16.0,
        "perf/decode_preemptions": 0.0,
        "perf/decode_graph_captures": captures,
        "perf/decode_graph_capture_s": capture_s,
    }


def test_the_report_gives_the_decode_graph_captures_per_measured_step(e2e: ModuleType, capsys) -> None:
    summary = e2e.summarise([row(2.0, 30, 0.5), row(2.0, 10, 0.3)])
    assert summary["decode_graph_captures"] == 40 and summary["decode_graph_capture_s"] == 0.8
    args = argparse.Namespace(shape="tiny", mode="colocated", kv_cache_dtype="auto", kv_cache_layout="paged", warmup=1)
    e2e.report_throughput(args, e2e.SHAPES["tiny"], summary)
    printed = capsys.readouterr().out
    assert "captured 20 decode shapes as CUDA graphs a step, 0.40 s of host time a step" in printed
    e2e.report_throughput(args, e2e.SHAPES["tiny"], e2e.summarise([row(2.0, 0, 0.0)]))
    assert "CUDA graphs" not in capsys.readouterr().out  # none captured (the CPU): no line
