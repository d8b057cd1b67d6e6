"""The command's exit codes, and the errors a subcommand reports as one line under each (no traceback).

Exit 0 is success, 2 bad input (a config, a dataset, a tokenizer, the command line itself), 3 a checkpoint the run
cannot resume from, 130 a Ctrl-C (:data:`sc_lightning.interrupt.EXIT_INTERRUPTED`); any other error is a bug or a
failure and keeps its traceback.
"""

from __future__ import annotations

import sys

EXIT_INVALID_CONFIG = 2
EXIT_CANNOT_RESUME = 3


def usage_error(text: str, message: str) -> int:
    """Print a subcommand's usage ``text`` and the error ``message``; returns the exit code of bad input."""
    print(f"{text}\nerror: {message}", file=sys.stderr)
    return EXIT_INVALID_CONFIG


def bad_input_errors() -> tuple[type[Exception], ...]:
    """What a fit reports as bad input (one line, no traceback, exit code 2): the config, the dataset, the tokenizer
    or their fit, the endpoint's port. Any other error is a bug or a failure and keeps its traceback."""
    from sc_lightning.config import ConfigError
    from sc_lightning.rollout.dataset_base import DatasetError
    from sc_lightning.rollout.serving.listen import EndpointPortError
    from sc_lightning.tokenizer import TokenizerLoadError, TokenizerMismatchError

    return ConfigError, DatasetError, TokenizerLoadError, TokenizerMismatchError, EndpointPortError


def cannot_resume_errors() -> tuple[type[Exception], ...]:
    """What a fit reports as a checkpoint it cannot resume from (one line, no traceback, exit code 3)."""
    from sc_lightning.checkpoint.atomic import BundleError
    from sc_lightning.checkpoint.fingerprint import FingerprintMismatch
    from sc_lightning.checkpoint.snapshots import SnapshotError
    from sc_lightning.config.resume_rules import ResumeMismatch
    from sc_lightning.data_plane.snapshot_files import SnapshotFormatError
    from sc_lightning.trainer.sharded_checkpoint import CheckpointMismatch

    return BundleError, SnapshotError, FingerprintMismatch, CheckpointMismatch, ResumeMismatch, SnapshotFormatError
