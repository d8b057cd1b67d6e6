"""``python -m sc_lightning validate --config X [--ckpt_path BUNDLE]``: one validation, and nothing else.

It builds what ``fit`` builds — the Trainer, the Single-Controller strategy, the policy (initial, or restored from
``BUNDLE``'s trainer checkpoint, exactly as a resume restores it) and the generation engine — then, once the
engine holds the policy (Lightning's ``on_fit_start``), runs one validation of that version
(:mod:`~sc_lightning.controller.validation`), and stops before any training step (``max_steps`` is the version
validated). The ``val/*`` metrics are printed as one JSON line, logged through the run's loggers at the version's
step, and written to ``<trainer.default_root_dir>/validation.json``. The rollout pump starts with the controller,
as in a fit; what it generates before the command ends is discarded.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from sc_lightning.checkpoint.bundle import TRAINER_FILE
from sc_lightning.cli.args import UsageError, parse_fit_arguments, take_value
from sc_lightning.cli.exits import EXIT_CANNOT_RESUME, EXIT_INVALID_CONFIG, cannot_resume_errors, usage_error
from sc_lightning.cli.load import load_and_check
from sc_lightning.config import ConfigError
from sc_lightning.interrupt import lightning_interrupt
from sc_lightning.preflight import check_preflight

VALIDATE_USAGE = """\
python -m sc_lightning validate --config CONFIG.yaml [--config MORE.yaml] [--a.b.c VALUE ...] [--ckpt_path BUNDLE]

  --ckpt_path     a checkpoint bundle (checkpointing.checkpoint_dir/step_N) or its trainer.ckpt: validate its
                  policy (default: the initial policy, version 0); a damaged bundle, or one that does not fit the
                  config, ends the command with exit code 3
  the validation set and its knobs are the run's: data.val_dataset_name, {algo}.max_val_samples, val_batch_size
"""


def validate_command(args: list[str]) -> int:
    """``validate``: load the policy, bring up the engine, run one validation, print its metrics."""
    from sc_lightning.checkpoint.atomic import verify_bundle
    from sc_lightning.checkpoint.resume_fit import check_resume_fits
    from sc_lightning.console import quiet_libraries

    try:
        bundle, rest = _take_ckpt_path(args)
        request = parse_fit_arguments(rest)
    except UsageError as exc:
        return usage_error(VALIDATE_USAGE, str(exc))
    if request is None:
        print(VALIDATE_USAGE)
        return 0
    quiet_libraries()
    try:
        config, lightning = load_and_check(request.configs, request.overrides)
        config = _validating(config)  # the run's validation knobs, whether or not it validates while training
        check_preflight(config, lightning.get("trainer") or {})
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    directory = None if bundle is None else _bundle_directory(Path(bundle))
    if bundle is not None and directory is None:
        print(f"error: --ckpt_path {bundle}: not a checkpoint bundle (no {TRAINER_FILE})", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    try:
        if directory is not None:
            verify_bundle(directory)  # as fit checks the bundle it resumes from
            check_resume_fits(directory, config)
        return _validate(config, lightning, directory)
    except cannot_resume_errors() as err:  # the bundle is damaged, or does not fit this config
        print(f"error: cannot resume: {err}", file=sys.stderr)
        return EXIT_CANNOT_RESUME


def _bundle_directory(path: Path) -> Path | None:
    """The bundle ``--ckpt_path`` names: the directory itself or its trainer checkpoint; None if it is neither."""
    directory = path.parent if path.name == TRAINER_FILE else path
    return directory if (directory / TRAINER_FILE).is_file() else None


def _validating(config: Any) -> Any:
    """``config`` with ``{algo}.val_at_start`` on (the controller then has a validator), checked again."""
    import dataclasses

    from sc_lightning.config import validate_single_controller_config

    config = dataclasses.replace(config, **{config.algo_name: dataclasses.replace(config.algo, val_at_start=True)})
    validate_single_controller_config(config)
    return config


def _take_ckpt_path(args: list[str]) -> tuple[str | None, list[str]]:
    bundle, rest, pending = None, [], list(args)
    while pending:
        arg = pending.pop(0)
        key, eq, value = arg.partition("=")
        if key == "--ckpt_path":
            bundle = value if eq else take_value(key, pending)
        else:
            rest.append(arg)
    return bundle, rest


def _validate(config: Any, lightning: dict[str, Any], bundle: Path | None) -> int:
    from sc_lightning.callbacks.validation import ValidateOnce
    from sc_lightning.cli.parser import SCLightningCLI
    from sc_lightning.engines.factory import default_engine_factory
    from sc_lightning.lightning.module import GRPOModule
    from sc_lightning.lightning.ppo_module import PPOModule
    from sc_lightning.lightning.strategy import single_controller_strategy

    once = ValidateOnce()
    trainer = lightning.setdefault("trainer", {})
    trainer["enable_checkpointing"] = False
    root = trainer.get("default_root_dir") or os.getcwd()
    if trainer.get("logger") in (None, True):
        trainer["logger"] = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": root}}
    step = _bundle_step(bundle)
    strategy = single_controller_strategy(config, default_engine_factory, ranks=1)
    cli = SCLightningCLI(
        lightning,
        instantiate=True,
        trainer_kwargs={"strategy": strategy, "max_steps": step},  # stop before any training step
        trainer_defaults={"callbacks": [once]},
    )
    module = PPOModule(config) if config.is_ppo else GRPOModule(config)
    with lightning_interrupt(cli.trainer):  # a Ctrl-C: main() says so and exits 130
        cli.trainer.fit(module, ckpt_path=None if bundle is None else str(bundle / TRAINER_FILE))
    if not once.results:
        print("error: no validation ran", file=sys.stderr)
        return 1
    metrics = {"step": once.results[-1].step, **once.results[-1].metrics()}
    Path(root).mkdir(parents=True, exist_ok=True)
    (Path(root) / "validation.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics))
    return 0


def _bundle_step(bundle: Path | None) -> int:
    """The RL step a bundle was written at (its controller state's trainer version); 0 without one."""
    if bundle is None:
        return 0
    from sc_lightning.checkpoint.bundle import read_controller_state

    return int(read_controller_state(bundle)["trainer_version"])
