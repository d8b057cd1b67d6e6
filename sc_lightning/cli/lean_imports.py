"""Import Lightning without torchmetrics' model-based metrics or TorchDynamo: seconds off the start of every command.

:func:`import_lightning` is how the CLI first imports Lightning (to check a config's ``trainer:`` keys).

``import lightning`` imports torchmetrics, whose package imports every metric it has. With ``transformers``
installed (sc_lightning needs it for Hugging Face checkpoints and tokenizers) its BERTScore, InfoLM and CLIP metrics
import transformers' auto models there and then, and its plot helpers import matplotlib: on the 2-core box that was
about 60% of the time ``fit`` took to check a config, for metrics sc_lightning never computes. Before Lightning's
first import the CLI tells torchmetrics, and only torchmetrics, that those optional packages are absent.
The same goes for torchvision (its image metrics: GPU images ship it). ``transformers``, ``matplotlib`` and
``torchvision`` themselves stay whole: they are imported when sc_lightning uses them (a tokenizer, a model import,
the run report). In such a process the left-out torchmetrics metrics raise torchmetrics' own "needs transformers"
(or torchvision) error.

Lightning also imports ``torch._dynamo`` (about 2 s on the 2-core box, as long as torch itself) for one name,
``OptimizedModule``, the wrapper ``torch.compile`` puts around a module, which Lightning checks modules against. The
CLI builds its modules itself and never compiles one, so it imports Lightning against a stand-in ``torch._dynamo``
whose ``OptimizedModule`` no module is an instance of, and whose ``disable`` (behind ``torch.compiler.disable``,
which Lightning decorates a few logging methods with: "never compile this") returns the function as it is, which
is what it means where nothing is compiled; the stand-in leaves ``sys.modules`` right after, and
anything that needs TorchDynamo later imports the real one.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

LEFT_OUT = (
    "_TRANSFORMERS_AVAILABLE",
    "_TRANSFORMERS_GREATER_EQUAL_4_4",
    "_TRANSFORMERS_GREATER_EQUAL_4_10",
    "_MATPLOTLIB_AVAILABLE",
    "_TORCHVISION_AVAILABLE",
)
"""torchmetrics' availability flags (in ``torchmetrics.utilities.imports``) that the CLI sets false.

torchvision too: torchmetrics' image metrics import it with the package, and torchvision imports
``torch._dynamo.utils``, which the stand-in ``torch._dynamo`` below does not have (GPU images ship torchvision)."""


def import_lightning() -> None:
    """Import ``lightning.pytorch`` as the CLI uses it: without torchmetrics' model-based metrics or TorchDynamo.

    Does nothing once Lightning is imported.
    """
    if "lightning" in sys.modules:
        return
    leave_out_model_metrics()
    with _dynamo_stand_in():
        importlib.import_module("lightning.pytorch")


class NeverCompiled:
    """Stands in for ``torch._dynamo.OptimizedModule`` while Lightning imports: the CLI compiles no module."""


@contextmanager
def _dynamo_stand_in() -> Iterator[None]:
    """A stand-in ``torch._dynamo`` in ``sys.modules`` for the block (unless the real one is imported already)."""
    if "torch._dynamo" in sys.modules:
        yield
        return
    stand_in = types.ModuleType("torch._dynamo", "sc_lightning's stand-in while Lightning imports (see lean_imports)")
    stand_in.OptimizedModule = NeverCompiled  # type: ignore[attr-defined]
    stand_in.disable = _left_uncompiled  # type: ignore[attr-defined]
    sys.modules["torch._dynamo"] = stand_in
    try:
        yield
    finally:
        del sys.modules["torch._dynamo"]


def _left_uncompiled(fn: Callable[..., Any] | None = None, recursive: bool = True, reason: str | None = None) -> Any:
    """``torch._dynamo.disable``'s signature where nothing is compiled: the function itself, or a decorator."""
    return fn if fn is not None else (lambda function: function)


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
