"""Staleness: how many weight versions behind the trainer each trained sample was, as a distribution and per step."""

from __future__ import annotations

from collections import Counter

from sc_lightning.report.plots.base import Plot, line_panel, new_figure, no_data, to_png
from sc_lightning.report.tables import RunData, Series

STALENESS = ("train/staleness_mean", "train/staleness_max")


def plot(run: RunData) -> Plot:
    """Draw the histogram of per-sample staleness (train_data.jsonl) and the logged mean and max per step."""
    figure, (histogram, per_step) = new_figure(2)
    series = {}
    counts = distribution(run)
    if counts[0]:
        histogram.bar(counts[0], counts[1], width=0.8)
        histogram.set(title="staleness of trained samples", xlabel="versions behind the trainer", ylabel="samples")
        histogram.set_xticks(counts[0])
        series["samples per staleness"] = counts
    else:
        no_data(histogram, "staleness of trained samples", "no train_data.jsonl (run with --data.train_data_log true)")
    series |= line_panel(per_step, run, STALENESS, "staleness per step", "versions")
    caption = (
        "Staleness = the step's trainer version minus the weight version a sample's generation started with "
        "(start_weight), counted over every sample train_data.jsonl records; right, the per-step mean and max "
        "the trainer logged."
    )
    return Plot("staleness", "Staleness", caption, to_png(figure), series)


def distribution(run: RunData) -> Series:
    """Each staleness that occurs (ascending) and how many trained samples had it."""
    counts = Counter(sample["step"] - sample["start_weight"] for sample in run.samples)
    values = sorted(counts)
    return tuple(float(v) for v in values), tuple(float(counts[v]) for v in values)
