"""Keep the command line's console readable: quiet library noise at its source, unless asked for it.

:func:`quiet_libraries` runs first thing in every process the CLI starts (each trainer rank runs the CLI too),
before megatron, Lightning or Ray is imported. What it quiets, none of which a user can act on:

- megatron-core's import-time ``UserWarning`` that Apex / Transformer Engine are not installed, once per module that
  falls back (six on a CPU box); the start banner says it once, in one line, where it matters (a CUDA trainer);
- torch's complaints about how megatron-core uses it: a non-leaf ``.grad`` read in its distributed optimizer, and
  deprecated checkpoint calls (``load_state_dict``, ``ShardedTensor``) when a distributed checkpoint is loaded;
- Lightning's complaint that LightningCLI gets ``args`` while ``sys.argv`` holds our own options (we hand it the
  merged config on purpose), its fall-back to the CSV logger without TensorBoard (the banner names the logger and
  its directory), a torch deprecation inside Lightning's own code, and its device, seed and "Tip" lines (the banner
  says the devices and the seed), its stop lines (```Trainer.fit` stopped: `max_epochs=1` reached.``: the whole run
  is one Lightning epoch; :mod:`~sc_lightning.callbacks.stop` says the real reason), its "Detected KeyboardInterrupt"
  line (the CLI says ``interrupted``), and torch's note on ``is_fx_tracing`` (called inside megatron) on many ranks;
- Ray's driver logs (the token-authentication notice, "Started a local Ray instance"): ``RAY_LOGGER_LEVEL``
  defaults to ``error``; set it (e.g. ``RAY_LOGGER_LEVEL=info``) to see them. The processes Ray starts (engine
  and data-plane actors) inherit ``PYTHONWARNINGS`` entries that drop megatron's Apex / Transformer Engine warnings.

``SC_LIGHTNING_VERBOSE=1`` turns all of it off: every library speaks as it would without sc_lightning.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import MutableMapping

VERBOSE_ENV = "SC_LIGHTNING_VERBOSE"
RAY_LOGGER_LEVEL_ENV = "RAY_LOGGER_LEVEL"  # read by Ray once, when it is imported

_QUIET_WARNINGS = (  # (message, module): regular expressions matched against the start of each
    (r".*(Apex|Transformer Engine).* not installed", ""),
    (r"The \.grad attribute of a Tensor that is not a leaf Tensor", r"megatron\.core\.optimizer"),
    (r"`load_state_dict` is deprecated", r"megatron\.core\.dist_checkpointing"),
    (r"Please use DTensor instead and we are deprecating ShardedTensor", ""),
    (r"LightningCLI's args parameter is intended to run from within Python", ""),
    (r"Starting from v1\.9\.0, `tensorboardX` has been removed", ""),
    (r".*isinstance\(treespec, LeafSpec\)` is deprecated", ""),
)
_DEVICE_AND_TIP_LINES = ("GPU available: ", "TPU available: ", "HPU available: ", "💡 Tip: ")
_STOP_LINES = ("`Trainer.fit` stopped: ", "Time limit reached. Elapsed time is ")
_DROPPED_LINES = {  # logger -> the lines of it dropped (the start banner says the devices and the seed)
    "lightning.pytorch.utilities.rank_zero": (*_DEVICE_AND_TIP_LINES, *_STOP_LINES, "Detected KeyboardInterrupt"),
    "lightning.fabric.utilities.rank_zero": _DEVICE_AND_TIP_LINES,
    "lightning.fabric.utilities.seed": ("Seed set to ",),
    "torch.fx._symbolic_trace": ("is_fx_tracing will return true",),
}
_CHILD_WARNINGS = ("ignore:Transformer Engine and Apex are not installed", "ignore:Apex is not installed")
"""PYTHONWARNINGS entries (a literal start of the message) for the processes Ray starts, which import megatron."""


def verbose(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether ``SC_LIGHTNING_VERBOSE`` asks for every library's own output."""
    return environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def quiet_libraries(environ: MutableMapping[str, str] = os.environ) -> None:
    """Quiet the known library noise for this process and the processes it starts (see the module docstring)."""
    if verbose(environ):
        return
    for message, module in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, module=module)
    for name, lines in _DROPPED_LINES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLines) for f in logger.filters):
            logger.addFilter(_DropLines(lines))
    environ.setdefault(RAY_LOGGER_LEVEL_ENV, "error")
    inherited = [entry for entry in environ.get("PYTHONWARNINGS", "").split(",") if entry]
    environ["PYTHONWARNINGS"] = ",".join([*inherited, *(w for w in _CHILD_WARNINGS if w not in inherited)])


class _DropLines(logging.Filter):
    """Drops a logger's records that contain one of ``lines``."""

    def __init__(self, lines: tuple[str, ...]) -> None:
        super().__init__()
        self.lines = lines

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to keep ``record``: all but those lines."""
        message = record.getMessage()
        return not any(line in message for line in self.lines)
