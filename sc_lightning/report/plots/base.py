"""What every plot shares: the :class:`Plot` it returns, an Agg figure, PNG bytes, and line, stacked and no-data
panels over the run's steps."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sc_lightning.report.tables import RunData, Series

PANEL_SIZE = (5.0, 3.3)
"""One panel's width and height in inches (at 100 dpi)."""


@dataclass(frozen=True)
class Plot:
    """One figure of the report: file stem ``name``, ``title``, ``caption``, its ``png`` bytes, and the ``series``
    it drew by label (x values, y values), so a test can compare them with the run's files."""

    name: str
    title: str
    caption: str
    png: bytes
    series: dict[str, Series] = field(default_factory=dict)


def new_figure(panels: int) -> tuple[Figure, list[Axes]]:
    """A figure of ``panels`` side by side, drawn by the Agg backend (no display, no pyplot state)."""
    figure = Figure(figsize=(PANEL_SIZE[0] * panels, PANEL_SIZE[1]), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, list(figure.subplots(1, panels, squeeze=False)[0])


def to_png(figure: Figure) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def no_data(axes: Axes, title: str, why: str) -> None:
    """Mark a panel as empty: ``no data yet`` and why (which metric or file it waits for)."""
    axes.set_title(title)
    axes.text(0.5, 0.5, f"no data yet\n{why}", ha="center", va="center", color="0.4", transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


def line_panel(
    axes: Axes, run: RunData, columns: Sequence[str], title: str, ylabel: str, why: str = ""
) -> dict[str, Series]:
    """Draw each of ``columns`` the run logged over steps; a no-data panel (saying ``why``, by default which
    columns are missing) when it logged none. Returns the lines."""
    drawn = {column: line for column in columns if (line := run.series(column))[0]}
    return draw_lines(axes, drawn, title, "step", ylabel, why or "no " + ", ".join(columns) + " logged")


def draw_lines(
    axes: Axes, lines: dict[str, Series], title: str, xlabel: str, ylabel: str, why: str
) -> dict[str, Series]:
    """Draw ``lines`` by label, or a no-data panel saying ``why`` when there are none. Returns the lines."""
    if not lines:
        no_data(axes, title, why)
        return {}
    for label, (xs, ys) in lines.items():
        axes.plot(xs, ys, marker=".", label=label)
    _label(axes, title, xlabel, ylabel)
    return lines


def stacked_panel(
    axes: Axes, run: RunData, columns: Sequence[str], title: str, ylabel: str, label: Callable[[str], str] = str
) -> dict[str, Series]:
    """Stack ``columns`` over the steps that logged any of them (a step missing one counts it as 0); a no-data
    panel when there are none. Returns each column's own values (not the running stack)."""
    if not columns:
        no_data(axes, title, f"no {title.lower()} metrics logged")
        return {}
    steps = sorted({step for step, row in run.metrics.items() if any(c in row for c in columns)})
    layers = {column: tuple(run.metrics[step].get(column, 0.0) for step in steps) for column in columns}
    axes.stackplot(steps, *layers.values(), labels=[label(column) for column in columns], alpha=0.85)
    _label(axes, title, "step", ylabel)
    return {column: (tuple(float(s) for s in steps), values) for column, values in layers.items()}


def _label(axes: Axes, title: str, xlabel: str, ylabel: str) -> None:
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="x-small")
