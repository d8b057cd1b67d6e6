"""Read a run directory into tidy tables: one row of metrics per RL step, the trained samples, the run info.

Lightning's CSVLogger writes ``<logger name>/version_N/metrics.csv``; a resumed run starts a new ``version_N``.
Versions are joined in order, and a later version replaces every step from its first one on (a run resumes from
a checkpoint and replays the steps after it, as ``train_data.jsonl`` rolls back). The CSV logger flushes only
every few steps, so a killed or running run may have a short CSV, a torn last line or none at all: torn rows are
skipped, and steps that only ``train_data.jsonl`` holds still count (see :meth:`RunData.reward`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sc_lightning.report.run_info import read_run_info
from sc_lightning.trainer.sample_log import SAMPLES_DIR, recorded_steps
from sc_lightning.trainer.train_data_log import FILENAME as TRAIN_DATA

Series = tuple[tuple[float, ...], tuple[float, ...]]
"""A plotted line: its x values and its y values."""

STEP_TIME = "timing/train/total_step_time"
VERSION = re.compile(r"version_(\d+)$")


@dataclass(frozen=True)
class RunData:
    """What a run directory holds: ``metrics`` (step -> column -> value), ``samples`` (train_data.jsonl's rows),
    ``info`` (run_info.yaml, or None), the metrics files read, in version order, and ``sample_records`` (step ->
    its ``samples/`` record's file)."""

    run_dir: Path
    metrics: dict[int, dict[str, float]]
    samples: list[dict[str, Any]]
    info: dict[str, Any] | None
    metrics_files: tuple[Path, ...]
    sample_records: dict[int, Path] = field(default_factory=dict)

    def columns(self, prefix: str = "") -> list[str]:
        """The metric columns starting with ``prefix`` that hold a value at some step, sorted."""
        return sorted({name for row in self.metrics.values() for name in row if name.startswith(prefix)})

    def series(self, column: str) -> Series:
        """``column`` over the steps that logged it, in step order."""
        points = [(step, row[column]) for step, row in sorted(self.metrics.items()) if column in row]
        return tuple(float(s) for s, _ in points), tuple(v for _, v in points)

    def wall_time(self) -> dict[int, float]:
        """Seconds of training at the end of each step: the running sum of ``timing/train/total_step_time``."""
        total, elapsed = 0.0, {}
        for step, row in sorted(self.metrics.items()):
            if STEP_TIME in row:
                total += row[STEP_TIME]
                elapsed[step] = total
        return elapsed

    def sample_steps(self) -> dict[int, list[dict[str, Any]]]:
        """The trained samples grouped by step, in step order."""
        by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for sample in self.samples:
            by_step[sample["step"]].append(sample)
        return dict(sorted(by_step.items()))

    def reward(self) -> Series:
        """The mean reward per step: ``train/reward`` where the CSV has it, else the mean of the step's samples."""
        by_step = {step: sum(s["reward"] for s in rows) / len(rows) for step, rows in self.sample_steps().items()}
        logged_steps, logged = self.series("train/reward")
        by_step.update(zip((int(step) for step in logged_steps), logged, strict=True))
        steps = sorted(by_step)
        return tuple(float(s) for s in steps), tuple(by_step[s] for s in steps)


def read_run(run_dir: str | Path) -> RunData:
    """Read everything the report needs from ``run_dir``; missing files give empty tables."""
    run_dir = Path(run_dir)
    files = metrics_files(run_dir)
    metrics: dict[int, dict[str, float]] = {}
    for path in files:
        version = read_metrics_csv(path)
        if version:
            first = min(version)
            metrics = {step: row for step, row in metrics.items() if step < first}
            metrics.update(version)
    samples = read_train_data(run_dir / TRAIN_DATA)
    return RunData(run_dir, metrics, samples, read_run_info(run_dir), files, recorded_steps(run_dir / SAMPLES_DIR))


def metrics_files(run_dir: Path) -> tuple[Path, ...]:
    """Every ``*/version_N/metrics.csv`` under ``run_dir``, by version number."""
    found = []
    for path in run_dir.glob("*/version_*/metrics.csv"):
        match = VERSION.match(path.parent.name)
        if match:
            found.append((int(match.group(1)), path))
    return tuple(path for _, path in sorted(found))


def read_metrics_csv(path: Path) -> dict[int, dict[str, float]]:
    """One CSVLogger file as step -> column -> value; rows of one step merge; torn, short or step-less rows, and cells
    that are no number, are skipped."""
    text = path.read_text(errors="replace")  # a byte that is not UTF-8 only spoils its own cell
    rows = csv.reader(io.StringIO(text[: text.rfind("\n") + 1]))  # a last line without its newline is torn
    header = next(rows, None)
    if header is None or "step" not in header:
        return {}
    table: dict[int, dict[str, float]] = defaultdict(dict)
    for cells in rows:
        if len(cells) != len(header):
            continue
        values = {name: _number(cell) for name, cell in zip(header, cells, strict=True)}
        step = values.pop("step")
        if step is not None:
            table[int(step)].update({k: v for k, v in values.items() if v is not None})
    return dict(table)


def read_train_data(path: Path) -> list[dict[str, Any]]:
    """``train_data.jsonl``'s trained rows, up to a line torn by a crash (nothing after it was durable); [] if none."""
    if not path.exists():
        return []
    samples = []
    for line in path.read_text().splitlines():
        try:
            sample = json.loads(line)
            int(sample["step"])
        except (ValueError, TypeError, KeyError):
            break
        if "filtered" not in sample:  # a group dynamic sampling filtered: consumed, never trained
            samples.append(sample)
    return samples


def _number(cell: str) -> float | None:
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
