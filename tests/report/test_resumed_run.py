"""The report of a real resumed run: the run-wide totals continue across the resume (the plot does not fall to zero,
the advice covers every step), the rows a killed process logged after its last bundle are not counted twice, and
docs/report.md's Python example runs."""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from sc_lightning.report import build_report
from sc_lightning.report.main import main
from sc_lightning.report.tables import read_run
from tests.helpers.cli import run
from tests.helpers.configs import REPO, TEST_BASE

pytestmark = pytest.mark.slow

FIRST, LAST = 3, 4  # the first process trains 3 steps; the resumed one, from step 2's bundle, up to 4
GROUPS = 4  # tests/small_steps.yaml: groups per step


def fit(run_dir: Path, steps: int) -> None:
    overrides = {
        "data_plane.backend": "memory",
        "checkpointing.enabled": "true",
        "checkpointing.save_data_plane": "true",
        "checkpointing.save_period": "1",
        "checkpointing.checkpoint_dir": str(run_dir / "checkpoints"),
        "grpo.max_num_steps": str(steps),
        "trainer.default_root_dir": str(run_dir),
        "trainer.enable_progress_bar": "false",
    }
    configs = [arg for path in TEST_BASE for arg in ("--config", str(path))]
    flags = [arg for knob, value in overrides.items() for arg in (f"--{knob}", value)]
    result = run("fit", *configs, *flags)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run killed after step 3 trained but before its bundle was written, then resumed from step 2's bundle."""
    run_dir = tmp_path_factory.mktemp("resumed_run")
    fit(run_dir, FIRST)
    shutil.rmtree(run_dir / "checkpoints" / f"step_{FIRST}")  # as if killed before the last bundle was written
    fit(run_dir, LAST)
    return run_dir


def logged(run_dir: Path, version: int) -> list[dict[str, float]]:
    """One process's rows of metrics.csv, as Lightning's CSV logger wrote them."""
    with (run_dir / "lightning_logs" / f"version_{version}" / "metrics.csv").open() as handle:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(handle)]


def test_the_totals_continue_across_the_resume_and_the_report_counts_every_step_once(
    resumed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, resumed = logged(resumed_run, 0), logged(resumed_run, 1)
    assert [row["step"] for row in first] == [0, 1, 2]
    assert [row["step"] for row in resumed] == [2, 3]  # step 2 again: the killed process's row is stale
    step_times = [row["timing/train/total_step_time"] for row in first[:2] + resumed]

    assert main([str(resumed_run), "--out", str(tmp_path / "report.html")]) == 0
    out = capsys.readouterr().out
    plots = {plot.name: plot for plot in build_report(resumed_run, tmp_path / "again.html")}
    wall = plots["goodput"].series["goodput/trainer/wall_total_s"]
    assert wall[0] == (0.0, 1.0, 2.0, 3.0)
    # the plotted total of each step is every step's time so far: no fall to zero at the resume, no step twice
    assert wall[1] == pytest.approx(tuple(np.cumsum(step_times)), rel=1e-4)
    for column, (_, values) in plots["goodput"].series.items():
        assert all(b >= a for a, b in zip(values, values[1:], strict=False)), (column, values)
    assert read_run(resumed_run).series("rollout/selected_total") == ((0.0, 1.0, 2.0, 3.0), (4.0, 8.0, 12.0, 16.0))

    summary = re.search(r"goodput over (\d+) steps: trainer ([\d.]+) s", out)
    assert summary is not None, out
    assert (int(summary[1]), float(summary[2])) == (LAST, round(sum(step_times), 1))
    assert out.count("advice:") == 1


def test_the_python_example_of_the_docs_runs(
    resumed_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (REPO / "docs" / "report.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    shutil.copytree(resumed_run, tmp_path / "runs" / "tiny")
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "docs/report.md", "exec"), {})  # as a user pastes it
    assert re.fullmatch(r"[\d.]+ s of training over 4 steps\n", capsys.readouterr().out)
    assert (tmp_path / "runs" / "tiny" / "report.html").is_file()
    assert (tmp_path / "runs" / "tiny" / "report_plots" / "goodput.png").is_file()
