"""Drops and retries: the rollout fleet's failure counters since the start and each step's dropped groups."""

from __future__ import annotations

from sc_lightning.report.plots.base import Plot, line_panel, new_figure, to_png
from sc_lightning.report.tables import RunData

PROGRESS = ("rollout/committed_total", "rollout/selected_total")
"""The ``rollout/*_total`` counters that count progress, not failures: left out."""


def plot(run: RunData) -> Plot:
    """Draw every failure-side ``rollout/*_total`` counter and every per-step ``train/*_groups`` count."""
    figure, (counters, per_step) = new_figure(2)
    totals = [c for c in run.columns("rollout/") if c.endswith("_total") and c not in PROGRESS]
    groups = [c for c in run.columns("train/") if c.endswith("_groups")]
    series = line_panel(counters, run, totals, "rollout failures since start", "count", "no rollout/*_total logged")
    series |= line_panel(per_step, run, groups, "groups dropped per step", "groups", "no train/*_groups logged")
    for axes in (counters, per_step):
        axes.set_ylim(bottom=0)  # counts: an all-zero run reads as a flat line at 0, not one centred at 0
    caption = (
        "Left: cumulative rollout counters — retries (redispatch_total), infra and data failures, groups dropped, "
        "replaced, promoted, evicted and aborted. Right: per step, groups the trainer dropped, replaced, "
        "promoted or aborted as stale (train/*_groups)."
    )
    return Plot("failures", "Drops and retries", caption, to_png(figure), series)
