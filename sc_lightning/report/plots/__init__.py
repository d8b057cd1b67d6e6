"""The report's figures, one module each; every ``plot(run)`` returns a :class:`~.base.Plot` with the series it drew."""

from collections.abc import Callable

from sc_lightning.report.plots import failures, goodput, reward, staleness, throughput, timing
from sc_lightning.report.plots.base import Plot
from sc_lightning.report.tables import RunData

PLOTTERS: tuple[Callable[[RunData], Plot], ...] = (
    reward.plot,
    staleness.plot,
    timing.plot,
    goodput.plot,
    throughput.plot,
    failures.plot,
)
"""Every figure, in the report's order."""

__all__ = ["PLOTTERS", "Plot"]
