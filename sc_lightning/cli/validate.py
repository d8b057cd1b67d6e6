"""``python -m sc_lightning validate --config X [--ckpt_path BUNDLE]``: one validation, and nothing else.

It builds what ``fit`` builds (:mod:`sc_lightning.cli.policy_run`, shared with ``generate``) — the Trainer, the
Single-Controller strategy, the policy (initial, or restored from ``BUNDLE``'s trainer checkpoint, exactly as a
resume restores it) and the generation engine — then, once the engine holds the policy (Lightning's
``on_fit_start``), runs one validation of that version (:mod:`~sc_lightning.controller.validation`), and stops
before any training step (``max_steps`` is the version validated). The ``val/*`` metrics are printed as one JSON
line, logged through the run's loggers at the version's step, and written to
``<trainer.default_root_dir>/validation.json``. The rollout pump starts with the controller, as in a fit; what it
generates before the command ends is discarded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sc_lightning.cli.args import UsageError, parse_fit_arguments
from sc_lightning.cli.exits import usage_error
from sc_lightning.cli.policy_run import PolicyRun, fit_once, run_on_policy, take_options

VALIDATE_USAGE = """\
python -m sc_lightning validate --config CONFIG.yaml [--config MORE.yaml] [--a.b.c VALUE ...] [--ckpt_path BUNDLE]

  --ckpt_path     a checkpoint bundle (checkpointing.checkpoint_dir/step_N) or its trainer.ckpt: validate its
                  policy (default: the initial policy, version 0); a damaged bundle, or one that does not fit the
                  config, ends the command with exit code 3
  the validation set and its knobs are the run's: data.val_dataset_name, {algo}.max_val_samples, val_batch_size
"""


def validate_command(args: list[str]) -> int:
    """``validate``: load the policy, bring up the engine, run one validation, print its metrics."""
    try:
        options, rest = take_options(args, valued=("--ckpt_path",))
        request = parse_fit_arguments(rest, "validate")
    except UsageError as exc:
        return usage_error(VALIDATE_USAGE, str(exc))
    if request is None:
        print(VALIDATE_USAGE)
        return 0
    # the run's validation knobs, whether or not it validates while training
    return run_on_policy(options.get("--ckpt_path"), request, _validate, adjust=_validating)


def _validating(config: Any) -> Any:
    """``config`` with ``{algo}.val_at_start`` on (the controller then has a validator), checked again."""
    import dataclasses

    from sc_lightning.config import validate_single_controller_config

    config = dataclasses.replace(config, **{config.algo_name: dataclasses.replace(config.algo, val_at_start=True)})
    validate_single_controller_config(config)
    return config


def _validate(run: PolicyRun) -> int:
    from sc_lightning.callbacks.validation import ValidateOnce

    once = ValidateOnce()
    trainer, root = run.lightning.setdefault("trainer", {}), run.root
    if trainer.get("logger") in (None, True):
        trainer["logger"] = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(root)}}
    fit_once(run, once)
    if not once.results:
        print("error: no validation ran", file=sys.stderr)
        return 1
    metrics = {"step": once.results[-1].step, **once.results[-1].metrics()}
    Path(root).mkdir(parents=True, exist_ok=True)
    (Path(root) / "validation.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics))
    return 0
