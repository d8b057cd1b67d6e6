"""Lean imports for the CLI's processes: Lightning without torchmetrics' model metrics, megatron without compiling.

Both cut seconds of imports that sc_lightning never uses from the start of every command on a CPU box.

``import lightning`` imports torchmetrics, whose package imports every metric it has. With ``transformers``
installed (sc_lightning needs it for Hugging Face checkpoints and tokenizers) its BERTScore, InfoLM and CLIP metrics
import transformers' auto models there and then, and its plot helpers import matplotlib: on the 2-core box that was
about 60% of the time ``fit`` took to check a config, for metrics sc_lightning never computes. Before Lightning's
first import the CLI tells torchmetrics, and only torchmetrics, that those optional packages are absent.
``transformers`` and ``matplotlib`` themselves stay whole: they are imported when sc_lightning uses them (a
tokenizer, a model import, the run report). In such a process the left-out torchmetrics metrics raise torchmetrics'
own "needs transformers" error.

``import megatron.core`` decorates a dozen optional fused functions (GeLU variants, squared ReLU, an output gate,
MoE routing; none on sc_lightning's model path) with ``torch.compile``, whose first call imports all of TorchInductor:
about 3 of the 9 CPU seconds that import took on the 2-core box. :func:`import_megatron_without_compile` imports
megatron with those decorators as no-ops (as megatron's own ``disable_jit_fuser`` would), so they would run eagerly.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

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


def import_megatron_without_compile() -> None:
    """Import ``megatron.core`` (when not imported yet) with its ``torch.compile`` decorators as no-ops."""
    if "megatron.core" in sys.modules or importlib.util.find_spec("megatron") is None:
        return
    import torch

    compile_ = torch.compile
    torch.compile = _eager  # megatron.core.jit keeps the function it finds here as its fuser
    try:
        importlib.import_module("megatron.core")
    finally:
        torch.compile = compile_


def _eager(model: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """``torch.compile``'s signature, compiling nothing: the function itself, or a decorator returning it."""
    return model if model is not None else (lambda fn: fn)
