"""Throughput: tokens per second (the training step's; the whole step's per GPU) and MFU (logged on GPUs only)."""

from __future__ import annotations

from sc_lightning.report.plots.base import Plot, line_panel, new_figure, to_png
from sc_lightning.report.tables import RunData


def plot(run: RunData) -> Plot:
    """Draw ``perf/tokens_per_s`` with ``perf/tokens_per_s_per_gpu``, and ``perf/mfu``, over steps, in two panels."""
    figure, (tokens, mfu) = new_figure(2)
    rates = ["perf/tokens_per_s", "perf/tokens_per_s_per_gpu"]
    series = line_panel(tokens, run, rates, "tokens per second", "tokens/s")
    series |= line_panel(mfu, run, ["perf/mfu"], "MFU", "fraction of peak FLOP/s")
    caption = (
        "Training throughput per step (perf/tokens_per_s: the training step's tokens over its time), the whole "
        "step's (perf/tokens_per_s_per_gpu: prompt + response tokens over the step's wall time and the run's GPUs, "
        "NeMo-RL's figure) and model FLOPs utilisation (perf/mfu: achieved over peak FLOP/s of the accelerator; "
        "logged only where a peak is known, i.e. on GPUs)."
    )
    return Plot("throughput", "Tokens/s and MFU", caption, to_png(figure), series)
