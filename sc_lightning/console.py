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
  says the devices and the seed);
- Ray's driver logs (the token-authentication notice, "Started a local Ray instance"): ``RAY_LOGGER_LEVEL``
  defaults to ``error``; set it (e.g. ``RAY_LOGGER_LEVEL=info``) to see them. Ray actors' own output stays in
  Ray's session logs (``/tmp/ray/session_latest/logs``): the engines start Ray with ``log_to_driver=False``.

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
_LIGHTNING_CHATTER = ("GPU available: ", "TPU available: ", "HPU available: ", "Seed set to ", "💡 Tip: ")
_LIGHTNING_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.seed",
)


def verbose(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether ``SC_LIGHTNING_VERBOSE`` asks for every library's own output."""
    return environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def quiet_libraries(environ: MutableMapping[str, str] = os.environ) -> None:
    """Quiet the known library noise for this process and the processes it starts (see the module docstring)."""
    if verbose(environ):
        return
    for message, module in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, module=module)
    for name in _LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningChatter) for f in logger.filters):
            logger.addFilter(_DropLightningChatter())
    environ.setdefault(RAY_LOGGER_LEVEL_ENV, "error")


class _DropLightningChatter(logging.Filter):
    """Drops Lightning's device, seed and tip lines (the start banner says the devices and the seed)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to keep ``record``: all but those lines."""
        message = record.getMessage()
        return not any(marker in message for marker in _LIGHTNING_CHATTER)
