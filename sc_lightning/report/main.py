"""``python -m sc_lightning report RUN_DIR [--out PATH]``: write the run's HTML report and its PNGs beside it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sc_lightning.report.page import render_page
from sc_lightning.report.plots import PLOTTERS, Plot
from sc_lightning.report.plots.goodput import advice_of
from sc_lightning.report.tables import read_run

REPORT = "report.html"


def build_report(run_dir: str | Path, out: str | Path | None = None) -> list[Plot]:
    """Write ``out`` (default ``run_dir/report.html``) and each plot as ``<out stem>_plots/<name>.png`` beside it;
    returns the plots, each with the series it drew. Works on a finished, running or killed run."""
    run = read_run(run_dir)
    out = Path(out) if out is not None else run.run_dir / REPORT
    plots = [plotter(run) for plotter in PLOTTERS]
    folder = plot_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    for plot in plots:
        (folder / f"{plot.name}.png").write_bytes(plot.png)
    out.write_text(render_page(run, plots))
    return plots


def plot_folder(out: Path) -> Path:
    """Where the PNGs of the report ``out`` go: ``<out stem>_plots/`` beside it."""
    return out.with_name(f"{out.stem}_plots")


def main(argv: list[str]) -> int:
    """Parse ``RUN_DIR [--out PATH]``, write the report, print its path and the run's allocation advice; 2 when
    RUN_DIR is not a directory."""
    parser = argparse.ArgumentParser(prog="python -m sc_lightning report", description=__doc__)
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run's trainer.default_root_dir")
    parser.add_argument("--out", type=Path, default=None, help=f"the HTML file to write (default RUN_DIR/{REPORT})")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"error: {args.run_dir} is not a directory", file=sys.stderr)
        return 2
    out = args.out if args.out is not None else args.run_dir / REPORT
    build_report(args.run_dir, out)
    print(f"wrote {out} (plots in {plot_folder(out)})")
    if (advice := advice_of(read_run(args.run_dir))) is not None:
        print(advice)
    return 0
