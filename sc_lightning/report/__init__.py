"""``python -m sc_lightning report RUN_DIR``: a self-contained HTML report of a run, finished, running or killed.

``tables`` reads a run directory (``metrics.csv`` of every ``version_N``, ``train_data.jsonl``, ``run_info.yaml``)
into one table by step; each module of ``plots/`` draws one figure from it and returns the series it drew;
``page`` assembles the HTML with the PNGs embedded; ``main`` is the command. ``run_info`` writes the resolved
config and library versions into the run directory when a run starts.
"""

from sc_lightning.report.main import build_report, main
from sc_lightning.report.run_info import RUN_INFO, read_run_info, write_run_info

__all__ = ["RUN_INFO", "build_report", "main", "read_run_info", "write_run_info"]
