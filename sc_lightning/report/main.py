"""``python -m sc_lightning report RUN_DIR [--out PATH]``: write the run's HTML report and its PNGs beside it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from sc_lightning.report.page import render_page
from sc_lightning.report.plots import PLOTTERS, Plot
from sc_lightning.report.plots.goodput import advice_of
from sc_lightning.report.run_info import RUN_INFO
from sc_lightning.report.samples import samples_section
from sc_lightning.report.tables import metrics_files, read_run
from sc_lightning.trainer.train_data_log import FILENAME as TRAIN_DATA

REPORT = "report.html"
EXIT_BAD_INPUT = 2


class ReportError(ValueError):
    """RUN_DIR holds no run, or the report cannot be written where asked; the message says what to give instead."""


def build_report(run_dir: str | Path, out: str | Path | None = None) -> list[Plot]:
    """Write ``out`` (default ``run_dir/report.html``) and each plot as ``<out stem>_plots/<name>.png`` beside it
    (the sampled answers' images as ``<out stem>_plots/samples/<name>.png``); returns the plots, each with the
    series it drew. Works on a finished, running or killed run; raises :class:`ReportError` naming the problem when
    ``run_dir`` holds no run or ``out`` cannot be written."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    out = Path(out) if out is not None else run_dir / REPORT
    if out.is_dir():
        raise ReportError(f"--out {out} is a directory; give the HTML file to write, e.g. --out {out / REPORT}")
    folder = plot_folder(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)  # before drawing: a path that cannot be written fails at once
        run = read_run(run_dir)
        plots = [plotter(run) for plotter in PLOTTERS]
        for plot in plots:
            (folder / f"{plot.name}.png").write_bytes(plot.png)
        out.write_text(render_page(run, plots, samples_section(run, folder)))
    except OSError as err:
        raise ReportError(
            f"cannot write the report {out} (and its plots in {folder}): {err.strerror or err}; give --out a path "
            "in a writable directory"
        ) from err
    return plots


def check_run_dir(run_dir: Path) -> None:
    """Raise :class:`ReportError` unless ``run_dir`` is a directory holding some file of a run."""
    fix = "give the run's trainer.default_root_dir"
    if not run_dir.is_dir():
        raise ReportError(f"RUN_DIR {run_dir} {'is not a directory' if run_dir.exists() else 'does not exist'}; {fix}")
    if not (metrics_files(run_dir) or (run_dir / TRAIN_DATA).is_file() or (run_dir / RUN_INFO).is_file()):
        raise ReportError(
            f"RUN_DIR {run_dir} holds no run: no */version_N/metrics.csv, {TRAIN_DATA} or {RUN_INFO} in it; {fix}"
        )


def plot_folder(out: Path) -> Path:
    """Where the PNGs of the report ``out`` go: ``<out stem>_plots/`` beside it."""
    return out.with_name(f"{out.stem}_plots")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is a :class:`ReportError` (so it ends in one ``error:`` line, exit code 2)."""

    def error(self, message: str) -> NoReturn:
        """Raise the mistake instead of printing argparse's own message and exiting."""
        raise ReportError(f"{message} (usage: {self.format_usage().removeprefix('usage: ').strip()})")


def main(argv: list[str]) -> int:
    """Parse ``RUN_DIR [--out PATH]``, write the report, print its path and the run's allocation advice; 2, with one
    ``error:`` line, when the arguments, RUN_DIR or the output path will not do."""
    parser = _Parser(prog="python -m sc_lightning report", description=__doc__)
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run's trainer.default_root_dir")
    parser.add_argument("--out", type=Path, default=None, help=f"the HTML file to write (default RUN_DIR/{REPORT})")
    try:
        args = parser.parse_args(argv)
        out = args.out if args.out is not None else args.run_dir / REPORT
        build_report(args.run_dir, out)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {out} (plots in {plot_folder(out)})")
    if (advice := advice_of(read_run(args.run_dir))) is not None:
        print(advice)
    return 0
