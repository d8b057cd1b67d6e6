"""Where each step's time went: the ``timing/train/*`` parts stacked, with the step's total time as a line."""

from __future__ import annotations

from sc_lightning.report.plots.base import Plot, new_figure, stacked_panel, to_png
from sc_lightning.report.tables import STEP_TIME, RunData

PREFIX = "timing/train/"


def plot(run: RunData) -> Plot:
    """Stack every ``timing/train/*`` part per step and draw ``total_step_time`` over it."""
    figure, (axes,) = new_figure(1)
    figure.set_figwidth(figure.get_figwidth() * 2)
    parts = [column for column in run.columns(PREFIX) if column != STEP_TIME]
    series = stacked_panel(axes, run, parts, "step time", "seconds", label=lambda c: c.removeprefix(PREFIX))
    steps, total = run.series(STEP_TIME)
    if steps:
        axes.plot(steps, total, color="black", marker=".", label="total_step_time")
        axes.legend(fontsize="x-small")
        series[STEP_TIME] = (steps, total)
    caption = (
        "Each step's timed phases (timing/train/*: exposed generation, policy training, weight sync, …) stacked, "
        "and the step's wall time (total_step_time, black). Phases can nest or overlap, and untimed work is not "
        "stacked, so the stack need not equal the total."
    )
    return Plot("step_time", "Step-time breakdown", caption, to_png(figure), series)
