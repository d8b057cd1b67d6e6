"""Throughput: trained tokens per second and model FLOPs utilisation (MFU, logged on GPU runs only)."""

from __future__ import annotations

from sc_lightning.report.plots.base import Plot, line_panel, new_figure, to_png
from sc_lightning.report.tables import RunData


def plot(run: RunData) -> Plot:
    """Draw ``perf/tokens_per_s`` and ``perf/mfu`` over steps, each in its own panel."""
    figure, (tokens, mfu) = new_figure(2)
    series = line_panel(tokens, run, ["perf/tokens_per_s"], "tokens per second", "tokens/s")
    series |= line_panel(mfu, run, ["perf/mfu"], "MFU", "fraction of peak FLOP/s")
    caption = (
        "Training throughput per step (perf/tokens_per_s) and model FLOPs utilisation (perf/mfu: achieved over "
        "peak FLOP/s of the accelerator; logged only where a peak is known, i.e. on GPUs)."
    )
    return Plot("throughput", "Tokens/s and MFU", caption, to_png(figure), series)
