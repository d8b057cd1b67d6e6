"""Import megatron-core without compiling its optional fusers: seconds off every process that builds a model.

``import megatron.core`` decorates a dozen optional fused functions (GeLU variants, squared ReLU, an output gate,
MoE routing; none on sc_lightning's model path) with ``torch.compile``, whose first call imports all of TorchInductor:
about 3 of the 9 CPU seconds that import took on the 2-core box. :func:`import_megatron_without_compile` imports
megatron with those decorators as no-ops (as megatron's own ``disable_jit_fuser`` would), so they would run eagerly.
The fit command calls it before its first megatron import, and so does the Megatron engine's Ray actor.

``wandb``, which megatron's inference context imports only to log to it if asked (sc_lightning never asks), is left
out of that import when the process has not imported it already: about 0.9 s. megatron sees it as absent;
sc_lightning's own W&B logger imports it as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


def import_megatron_without_compile() -> None:
    """Import ``megatron.core`` (when not imported yet) with its ``torch.compile`` decorators as no-ops."""
    if "megatron.core" in sys.modules or importlib.util.find_spec("megatron") is None:
        return
    import torch

    compile_ = torch.compile
    torch.compile = _eager  # megatron.core.jit keeps the function it finds here as its fuser
    modules: dict[str, Any] = sys.modules
    leave_out_wandb = "wandb" not in modules
    if leave_out_wandb:
        modules["wandb"] = None  # meanwhile, `import wandb` raises ImportError
    try:
        importlib.import_module("megatron.core")
    finally:
        torch.compile = compile_
        if leave_out_wandb:
            del modules["wandb"]


def _eager(model: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """``torch.compile``'s signature, compiling nothing: the function itself, or a decorator returning it."""
    return model if model is not None else (lambda fn: fn)
