"""Reward (and the validation rewards, when the run logs ``val/*``) over steps and over training wall time."""

from __future__ import annotations

from sc_lightning.report.plots.base import Plot, draw_lines, new_figure, to_png
from sc_lightning.report.tables import RunData, Series

WHY = "no train/reward in metrics.csv and no train_data.jsonl"
REWARD_WORDS = ("reward", "accuracy")
"""A ``val/*`` column is drawn on the reward axis when its name has one of these (``val/reward``, ``val/accuracy``,
``val/teacher_reward/<alias>``); counts, lengths, durations and KLs are on other scales."""


def plot(run: RunData) -> Plot:
    """Draw the mean reward per step (and the ``val/*`` rewards and accuracy) against the step and against wall
    time."""
    figure, (by_step, by_time) = new_figure(2)
    rewards = [column for column in run.columns("val/") if any(word in column for word in REWARD_WORDS)]
    lines = {"train/reward": run.reward()} | {column: run.series(column) for column in rewards}
    lines = {label: line for label, line in lines.items() if line[0]}
    wall = run.wall_time()
    timed = {label: _against(wall, line) for label, line in lines.items()}
    timed = {label: line for label, line in timed.items() if line[0]}
    series = draw_lines(by_step, lines, "reward over steps", "step", "mean reward", WHY)
    drawn = draw_lines(by_time, timed, "reward over wall time", "training wall time (s)", "mean reward", WHY)
    series |= {f"{label} vs wall time": line for label, line in drawn.items()}
    caption = (
        "Mean reward of each step's trained samples (train/reward; for steps the CSV logger had not flushed yet, "
        "the mean over train_data.jsonl), and the validation rewards and accuracy when the run validates. Wall "
        "time is the running sum of timing/train/total_step_time, so it leaves out start-up and restarts."
    )
    return Plot("reward", "Reward", caption, to_png(figure), series)


def _against(wall: dict[int, float], line: Series) -> Series:
    points = [(wall[int(step)], value) for step, value in zip(*line, strict=True) if int(step) in wall]
    return tuple(t for t, _ in points), tuple(v for _, v in points)
