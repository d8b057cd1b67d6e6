"""``python -m sc_lightning report RUN_DIR``: a self-contained HTML report of a run, finished, running or killed.

``tables`` reads a run directory (``metrics.csv`` of every ``version_N``, ``train_data.jsonl``, ``run_info.yaml``)
into one table by step; each module of ``plots/`` draws one figure from it and returns the series it drew;
``page`` assembles the HTML with the PNGs embedded; ``main`` is the command. ``run_info`` writes the resolved
config and library versions into the run directory when a run starts (``fit`` imports it alone: the plotting
modules, matplotlib included, load only for ``report``). The public names below load on first use, for that
reason::

    from sc_lightning.report import build_report
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sc_lightning.report.main import ReportError, build_report
    from sc_lightning.report.run_info import read_run_info, write_run_info
    from sc_lightning.report.tables import read_run

_LAZY = {
    "ReportError": "sc_lightning.report.main",
    "build_report": "sc_lightning.report.main",
    "read_run": "sc_lightning.report.tables",
    "read_run_info": "sc_lightning.report.run_info",
    "write_run_info": "sc_lightning.report.run_info",
}
"""Public name -> the module that defines it, imported on first access."""

__all__ = ["ReportError", "build_report", "read_run", "read_run_info", "write_run_info"]


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first access."""
    if name not in _LAZY:
        raise AttributeError(f"module 'sc_lightning.report' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
