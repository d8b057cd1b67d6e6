"""Import Lightning without torchmetrics' model-based metrics: seconds off the start of every command.

``import lightning`` imports torchmetrics, whose package imports every metric it has. With ``transformers``
installed (sc_lightning needs it for Hugging Face checkpoints and tokenizers) its BERTScore, InfoLM and CLIP metrics
import transformers' auto models there and then, and its plot helpers import matplotlib: on the 2-core box that was
about 60% of the time ``fit`` took to check a config, for metrics sc_lightning never computes. Before Lightning's
first import the CLI tells torchmetrics, and only torchmetrics, that those optional packages are absent.
``transformers`` and ``matplotlib`` themselves stay whole: they are imported when sc_lightning uses them (a
tokenizer, a model import, the run report). In such a process the left-out torchmetrics metrics raise torchmetrics'
own "needs transformers" error.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

LEFT_OUT = (
    "_TRANSFORMERS_AVAILABLE",
    "_TRANSFORMERS_GREATER_EQUAL_4_4",
    "_TRANSFORMERS_GREATER_EQUAL_4_10",
    "_MATPLOTLIB_AVAILABLE",
)
"""torchmetrics' availability flags (in ``torchmetrics.utilities.imports``) that the CLI sets false."""


def leave_out_model_metrics() -> None:
    """Make torchmetrics see transformers and matplotlib as absent; call before anything imports Lightning.

    Does nothing once torchmetrics is imported (its metrics already chose), or where it is not installed.
    """
    if "torchmetrics" in sys.modules or importlib.util.find_spec("torchmetrics") is None:
        return
    flags = _import_without_parents("torchmetrics.utilities.imports")
    for name in LEFT_OUT:
        cache = getattr(flags, name, None)
        if cache is not None:  # a RequirementCache: it answers from these two once they are set
            cache.available, cache.message = False, "left out by sc_lightning's CLI (never used here)"


def _import_without_parents(name: str) -> object:
    """Import module ``name`` without running its parent packages' ``__init__`` (torchmetrics' imports every metric).

    The parents stand in as empty modules while ``name`` loads, then leave ``sys.modules``; the package's real import
    later finds ``name`` already there and uses that very module.
    """
    parents = name.split(".")[:-1]
    stand_ins = [".".join(parents[: i + 1]) for i in range(len(parents))]
    for package in stand_ins:
        sys.modules[package] = importlib.util.module_from_spec(importlib.util.find_spec(package))
    try:
        return importlib.import_module(name)
    finally:
        for package in stand_ins:
            del sys.modules[package]
