"""``python -m sc_lightning report RUN_DIR``: a self-contained HTML report of a run, finished, running or killed.

``tables`` reads a run directory (``metrics.csv`` of every ``version_N``, ``train_data.jsonl``, ``run_info.yaml``)
into one table by step; each module of ``plots/`` draws one figure from it and returns the series it drew;
``page`` assembles the HTML with the PNGs embedded; ``main`` is the command. ``run_info`` writes the resolved
config and library versions into the run directory when a run starts (``fit`` imports it alone: the plotting
modules, matplotlib included, load only for ``report``).
"""
