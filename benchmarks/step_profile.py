"""Where a training step's wall time goes: the device's busy time against the wall, its idle gaps, and the kernels and
host calls that took the longest (``torch.profiler`` with CPU and, on a GPU, CUDA activities).

``e2e.py --profile-train`` profiles the fit's last training step (:class:`StepProfile`, a Lightning callback the fit's
config names) and, in its own process, the parts' training benchmark on the same rows (:func:`profiled`), then prints
both summaries (:func:`format_summary`). A fit whose training step is slower than its own benchmark then shows which
it is: kernels that ran longer (different work), or a device left idle while the host did something else (which, the
host table says), or a host stalled by Python's garbage collector (its collections in the window are timed: the
fit's process holds a far larger heap than the benchmark's, and a full collection walks all of it). The callback's
window runs from the step's ``on_train_batch_start`` to its ``on_train_batch_end``:
the colocated engine's stand-down is inside it, the refit after it is not.
"""

from __future__ import annotations

import gc
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.autograd import DeviceType

GAP_BUCKETS_MS = (0.1, 1.0, 10.0, 100.0)
"""Idle gaps are counted and summed by the shortest of these lengths (ms) they reach."""


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals, as disjoint intervals in start order."""
    union: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


def idle_gaps(busy: list[tuple[float, float]], start: float, end: float) -> list[float]:
    """The lengths of the stretches of ``[start, end]`` that no interval of ``busy`` (disjoint, in order) covers."""
    gaps, at = [], start
    for begin, finish in busy:
        if begin > at:
            gaps.append(min(begin, end) - at)
        at = max(at, finish)
        if at >= end:
            break
    if at < end:
        gaps.append(end - at)
    return [gap for gap in gaps if gap > 0]


def gap_buckets(gaps_us: list[float]) -> dict[str, dict[str, float]]:
    """Idle gaps (us) by :data:`GAP_BUCKETS_MS` bucket: how many reach each length and the seconds they add up to."""
    buckets: dict[str, dict[str, float]] = {}
    bounds = (*GAP_BUCKETS_MS, float("inf"))
    for low, high in zip(bounds, bounds[1:], strict=False):
        inside = [gap for gap in gaps_us if low * 1e3 <= gap < high * 1e3]
        buckets[f">={low:g} ms"] = {"count": len(inside), "s": sum(inside) / 1e6}
    return buckets


def profile_summary(profile: torch.profiler.profile, top: int = 12) -> dict[str, Any]:
    """The profiled window's wall time, the device's busy and idle time in it with the idle gaps by length (on a
    GPU), the ``top`` kernels by device time and host calls by self CPU time, and every host call's count."""
    events = profile.events()
    host = [e for e in events if e.device_type == DeviceType.CPU and e.time_range.end > e.time_range.start]
    device = [e for e in events if e.device_type == DeviceType.CUDA]
    start, end = min(e.time_range.start for e in host), max(e.time_range.end for e in host)
    summary: dict[str, Any] = {"wall_s": (end - start) / 1e6}
    if device:
        busy = merged([(e.time_range.start, e.time_range.end) for e in device])
        gaps = idle_gaps(busy, start, end)
        summary |= {"device_busy_s": summary["wall_s"] - sum(gaps) / 1e6, "idle_s": sum(gaps) / 1e6}
        summary["idle_gaps"] = gap_buckets(gaps)
        kernels: Counter[str] = Counter()
        for event in device:
            kernels[event.name] += event.time_range.end - event.time_range.start
        summary["kernels"] = [(name, us / 1e6) for name, us in kernels.most_common(top)]
    averages = profile.key_averages()
    by_self_cpu = sorted(averages, key=lambda a: a.self_cpu_time_total, reverse=True)[:top]
    summary["host"] = [(a.key, a.self_cpu_time_total / 1e6, a.count) for a in by_self_cpu]
    summary["calls"] = {a.key: a.count for a in averages}  # every host call's count, not only the top ones
    return summary


class GcPauses:
    """Times Python's garbage collections while installed (``gc.callbacks``): count and seconds by generation."""

    def __init__(self) -> None:
        self.count, self.seconds = [0, 0, 0], [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._started

    def summary(self) -> dict[str, Any]:
        """The collections by generation (0, 1, 2), their seconds, and the objects the collector tracks now."""
        return {"collections": self.count, "seconds": self.seconds, "tracked_objects": len(gc.get_objects())}


def format_summary(title: str, summary: dict[str, Any]) -> str:
    """``summary`` (:func:`profile_summary`) as Markdown under ``title``."""
    lines = [f"\n{title}: wall {summary['wall_s']:.3f} s"]
    if "device_busy_s" in summary:
        busy, idle = summary["device_busy_s"], summary["idle_s"]
        lines[0] += f", device busy {busy:.3f} s ({busy / summary['wall_s']:.1%}), idle {idle:.3f} s"
        buckets = summary["idle_gaps"].items()
        lines.append("idle gaps: " + ", ".join(f"{k}: {v['count']} ({v['s']:.3f} s)" for k, v in buckets))
        lines += ["| kernel | device s |", "|---|---:|"]
        lines += [f"| {name[:90]} | {seconds:.3f} |" for name, seconds in summary["kernels"]]
    collections = summary["gc"]
    lines.append(
        f"garbage collections by generation 0/1/2: {'/'.join(map(str, collections['collections']))}, "
        f"{sum(collections['seconds']):.3f} s ({collections['seconds'][2]:.3f} s in full ones); "
        f"{collections['tracked_objects']:,} objects tracked"
    )
    lines += ["| host call | self CPU s | calls |", "|---|---:|---:|"]
    lines += [f"| {name[:90]} | {seconds:.3f} | {count} |" for name, seconds, count in summary["host"]]
    return "\n".join(lines)


@contextmanager
def profiled(device: torch.device) -> Iterator[Callable[[], dict[str, Any]]]:
    """Profile the block (the device synchronised at both ends) and time its garbage collections; yields a function
    giving its summary afterwards."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    try:
        with torch.profiler.profile(activities=activities) as profile:
            yield lambda: profile_summary(profile) | {"gc": pauses.summary()}
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    finally:
        gc.callbacks.remove(pauses)


class StepProfile(Callback):
    """Profile training step ``step`` (its ``global_step`` at the start) and write its summary to ``path`` (JSON)."""

    def __init__(self, path: str, step: int) -> None:
        self.path, self.step = Path(path), step
        self._profile: Any = None
        self._summary: Callable[[], dict[str, Any]] | None = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Start profiling when the step is the one asked for."""
        if trainer.global_step == self.step:
            self._profile = profiled(pl_module.device)
            self._summary = self._profile.__enter__()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Stop profiling after the step (its summary waits for the end of training: summarising a step's trace
        takes seconds that would count in the step's own time)."""
        if self._profile is not None:
            self._profile.__exit__(None, None, None)
            self._profile = None

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Write the profiled step's summary."""
        if self._summary is not None:
            self.path.write_text(json.dumps(self._summary(), indent=2))
            self._summary = None
