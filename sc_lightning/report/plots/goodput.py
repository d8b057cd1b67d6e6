"""Goodput per fleet: where each fleet's time went, from the cumulative ``goodput/<fleet>/<part>_total_s`` metrics."""

from __future__ import annotations

import re
from collections.abc import Callable

from sc_lightning.report.plots.base import Plot, new_figure, no_data, stacked_panel, to_png
from sc_lightning.report.tables import RunData
from sc_lightning.rollout.goodput import EngineTime
from sc_lightning.trainer.goodput import TRAINER_PARTS, allocation_advice

TOTAL = re.compile(r"goodput/(?P<fleet>[^/]+)/(?P<part>.+)_total_s$")
WALL = "wall"
"""The part name of a fleet's whole time (the sum of its parts): drawn as a line over the stack, not stacked."""


def fleets(run: RunData) -> dict[str, list[str]]:
    """The run's ``goodput/<fleet>/<part>_total_s`` columns by fleet, whatever fleets and parts it logged."""
    found: dict[str, list[str]] = {}
    for column in run.columns("goodput/"):
        match = TOTAL.match(column)
        if match:
            found.setdefault(match["fleet"], []).append(column)
    return found


def plot(run: RunData) -> Plot:
    """One panel per fleet: its time parts stacked over steps, and its wall time (when logged) as a line."""
    by_fleet = fleets(run)
    figure, panels = new_figure(max(len(by_fleet), 1))
    series = {}
    for axes, (fleet, columns) in zip(panels, by_fleet.items(), strict=False):
        parts = [column for column in columns if _part(column) != WALL]
        label = _shares(run, parts)
        series |= stacked_panel(axes, run, parts, f"{fleet} fleet", "seconds since start", label=label)
        for column in set(columns) - set(parts):
            series[column] = run.series(column)
            axes.plot(*series[column], color="black", marker=".", label=WALL)
            axes.legend(fontsize="x-small")
    if not by_fleet:
        no_data(panels[0], "goodput", "no goodput/<fleet>/<part>_total_s metrics logged")
    caption = (
        "Cumulative seconds each fleet spent in each part (goodput/<fleet>/<part>_total_s), stacked per fleet, "
        "with the fleet's wall time as a line; the legend gives each part's share at the last step. The "
        "trainer's productive share and the engines' trained share are the goodput."
    )
    if (advice := advice_of(run)) is not None:
        caption += " " + advice
    return Plot("goodput", "Goodput per fleet", caption, to_png(figure), series)


def advice_of(run: RunData) -> str | None:
    """The allocation advice a fit prints at its end, from the last logged step's totals, which are the run's
    since step 0 (a resumed run continues them), so they cover that step's index + 1 steps (None: not logged)."""
    steps = [step for step, row in run.metrics.items() if "goodput/engine/wall_total_s" in row]
    if not steps:
        return None
    last = run.metrics[max(steps)]
    trainer = {part: last.get(f"goodput/trainer/{part}_total_s", 0.0) for part in TRAINER_PARTS}
    engine = EngineTime(
        **{f"{part}_s": last.get(f"goodput/engine/{part}_total_s", 0.0) for part in EngineTime().parts()},
        trained_tokens=int(last.get("goodput/engine/trained_tokens_total", 0)),
        wasted_tokens=int(last.get("goodput/engine/wasted_tokens_total", 0)),
    )
    return allocation_advice(trainer, engine, steps=max(steps) + 1)


def _part(column: str) -> str:
    match = TOTAL.match(column)
    return match["part"] if match else column


def _shares(run: RunData, columns: list[str]) -> Callable[[str], str]:
    """Legend labels: a part's name and its share of the fleet's time at the fleet's last logged step."""
    last = {column: run.series(column)[1][-1] for column in columns}
    whole = sum(last.values()) or 1.0
    return lambda column: f"{_part(column)} ({100 * last[column] / whole:.0f}%)"
