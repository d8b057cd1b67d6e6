"""The command line, ``python -m sc_lightning``: the composition root of a run, imported by nothing but ``__main__``.

Its modules depend in one direction: :mod:`~sc_lightning.cli.main` dispatches the subcommands to
:mod:`~sc_lightning.cli.fit`, :mod:`~sc_lightning.cli.validate` and :mod:`~sc_lightning.cli.generate` (the last two
through :mod:`~sc_lightning.cli.policy_run`; and to ``knobs`` and ``report``), which load a config through
:mod:`~sc_lightning.cli.load`; below them are :mod:`~sc_lightning.cli.args` (usage texts, ``fit``'s
argument parser), :mod:`~sc_lightning.cli.exits` (exit codes and the errors behind them) and
:mod:`~sc_lightning.cli.parser` (LightningCLI over ``trainer:``, the one module here that imports Lightning at its
top, and so imported only where a config's Lightning side is parsed).
"""
