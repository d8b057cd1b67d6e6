"""Import tensordict without TorchDynamo: seconds off every process of the TransferQueue data plane.

TransferQueue carries rows in tensordict's ``TensorDict``. At import, tensordict marks a few of its helpers with
``torch.compiler.allow_in_graph`` and ``assume_constant_result``, and the first call of either imports all of
TorchDynamo: about 3.3 of the 5 s that ``import transfer_queue`` took on the 2-core box, paid by each of
TransferQueue's actors as it starts (its controller, then its storage units, one after the other, at the start of every
run with a TransferQueue data plane). None of these processes compiles anything, and outside a compiled graph both
marks mean nothing (each returns its function as it is). :func:`import_tensordict_without_dynamo` imports tensordict
with the two as plain pass-throughs, the way :mod:`~sc_lightning.models.megatron_import` imports megatron-core without
compiling its fusers, then puts torch's own back. Where TorchDynamo is imported already the import is the usual one.

The driver calls it before importing TransferQueue; Ray's worker processes call it at start when the data plane starts
or joins Ray (:data:`SETUP_HOOK`, a ``worker_process_setup_hook`` of the run's Ray job), which is where TransferQueue's
actors import it. A process that reads rows still imports TorchDynamo at its first read: torch's jagged nested tensors,
which TransferQueue returns rows in, mark their lengths dynamic through it. TransferQueue's controller and storage
units never build one. Stdlib only at import.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

SETUP_HOOK = f"{__name__}.import_tensordict_without_dynamo"
"""The Ray ``worker_process_setup_hook`` (a module path) that imports tensordict this way in each worker."""


def import_tensordict_without_dynamo() -> None:
    """Import ``tensordict`` (when not imported yet) with torch's compile-only marks as pass-throughs meanwhile."""
    if "tensordict" in sys.modules or importlib.util.find_spec("tensordict") is None:
        return
    if "torch._dynamo" in sys.modules:  # paid for already: the marks may as well register
        importlib.import_module("tensordict")
        return
    import torch.compiler

    marks = torch.compiler.allow_in_graph, torch.compiler.assume_constant_result
    torch.compiler.allow_in_graph = torch.compiler.assume_constant_result = _as_is  # type: ignore[assignment]
    try:
        importlib.import_module("tensordict")
    finally:
        torch.compiler.allow_in_graph, torch.compiler.assume_constant_result = marks


def _as_is(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What ``allow_in_graph`` and ``assume_constant_result`` do outside a compiled graph: the function itself."""
    return fn
