"""``python -m sc_lightning fit --config x.yaml``: the composition root of a run.

The subcommands are ``fit``, ``knobs`` (the config reference in a terminal) and ``report`` (a run's HTML report);
:mod:`sc_lightning.cli_args` holds the usage texts and ``fit``'s argument parser.

One YAML holds the spec's sections at top level (``grpo:``, ``policy:``, ``async_rl:`` …) and Lightning's
``trainer:`` / ``seed_everything:``. Several ``--config`` files are deep-merged in order, then ``--a.b.c value``
overrides apply, then ``${…}`` interpolations resolve. The spec sections are loaded and validated first (cheap,
no Lightning import), then LightningCLI parses the Lightning side; any problem ends the command with exit code 2
and a list of every error, before any model, engine, Ray or data plane starts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import yaml

from sc_lightning.cli_args import FIT_USAGE, KNOBS_USAGE, UsageError, fit_help, parse_fit_arguments, usage
from sc_lightning.config import (
    ConfigError,
    SCConfig,
    config_to_dict,
    load_config,
    resolve,
    validate_single_controller_config,
)
from sc_lightning.config.yaml_io import load_yaml_layers
from sc_lightning.console import quiet_libraries
from sc_lightning.interrupt import EXIT_INTERRUPTED, InterruptWatch, lightning_interrupt
from sc_lightning.lean_imports import leave_out_model_metrics
from sc_lightning.preflight import check_preflight

LIGHTNING_KEYS = ("trainer", "seed_everything")
EXIT_INVALID_CONFIG = 2
EXIT_CANNOT_RESUME = 3


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    command = _SUBCOMMANDS.get(args[0])
    if command is None:
        return _usage_error(usage(), f"unknown subcommand {args[0]!r}; the subcommands are {', '.join(_SUBCOMMANDS)}")
    leave_out_model_metrics()  # before anything imports Lightning: seconds off every command's start
    try:
        return command(args[1:])
    except KeyboardInterrupt:  # Ctrl-C: whatever had started has been stopped on the way here
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def fit_command(args: list[str]) -> int:
    """``fit``: validate the config, then train (or only print the resolved config, or only check it)."""
    try:
        request = parse_fit_arguments(args)
    except UsageError as exc:
        return _usage_error(FIT_USAGE, str(exc))
    if request is None:
        print(fit_help())
        return 0
    watch = InterruptWatch().install()
    quiet_libraries()  # before megatron, Lightning or Ray is imported
    started = time.monotonic()
    try:
        config, lightning = load_and_check(request.configs, request.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    if request.print_config:
        print(render_config(config, lightning), end="")
        return 0
    try:
        check_preflight(config, lightning.get("trainer") or {})  # what the config needs from this machine
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    if request.dry_run:
        print(_dry_run_summary(config, time.monotonic() - started))
        return 0
    return fit(config, lightning, watch)


def knobs_command(args: list[str]) -> int:
    """``knobs [SECTION]``: each knob's type, default, unit and meaning, and the rules that tie it to others."""
    if any(arg in ("-h", "--help") for arg in args):
        print(KNOBS_USAGE)
        return 0
    if len(args) > 1 or (args and args[0].startswith("-")):
        return _usage_error(KNOBS_USAGE, f"knobs takes at most one SECTION, got {' '.join(args)!r}")
    from sc_lightning.config.reference_text import UnknownKnobPath, render_knobs

    if args and args[0].split(".")[0] in LIGHTNING_KEYS:
        print(f"error: {args[0]} is Lightning's: see lightning.pytorch.Trainer, or fit --print_config", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    try:
        text = render_knobs(args[0] if args else None)
    except UnknownKnobPath as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    print(text, end="")
    return 0


def report_command(args: list[str]) -> int:
    """``report RUN_DIR [--out PATH]``: the run's self-contained HTML report with its PNG plots."""
    from sc_lightning.report.main import main as report_main

    return report_main(args)


def validate_command(args: list[str]) -> int:
    """``validate --config X [--ckpt_path BUNDLE]``: one validation of the initial or a bundle's policy."""
    from sc_lightning.cli_validate import validate_command as run_validation

    return run_validation(args)


_SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "fit": fit_command,
    "validate": validate_command,
    "knobs": knobs_command,
    "report": report_command,
}
"""Each subcommand's function, given the arguments after its name; cli_args.SUBCOMMANDS_HELP says what each does."""


def _usage_error(text: str, message: str) -> int:
    print(f"{text}\nerror: {message}", file=sys.stderr)
    return EXIT_INVALID_CONFIG


def fit(config: SCConfig, lightning: dict[str, Any], watch: InterruptWatch | None = None) -> int:
    """Train: a Lightning Trainer (from ``trainer:``) with the Single-Controller strategy and the refit callback.

    ``config`` has passed :func:`load_and_check` and :func:`~sc_lightning.preflight.check_preflight`. With
    checkpointing on, the run holds its checkpoint directory (one run at a time) and resumes from its newest bundle,
    or only says so when that bundle has trained every step already. A Ctrl-C before training (which ``watch`` saw,
    even if a library swallowed it) stops the run gracefully and raises KeyboardInterrupt; one while training stops
    it after the step in progress (:class:`~sc_lightning.callbacks.stop.FitStop`)."""
    watch = watch or InterruptWatch()
    if not config.checkpointing.enabled:
        return _train(config, lightning, None, watch)
    from sc_lightning.checkpoint.dir_lock import CheckpointDirInUse
    from sc_lightning.checkpoint.snapshots import nothing_left_to_train

    try:
        with _checkpoint_dir_lock(config):
            try:
                resume = _resume_point(config)
                finished = nothing_left_to_train(resume, config)
            except _cannot_resume_errors() as err:  # nothing was deleted or rewritten
                print(f"error: cannot resume: {err}", file=sys.stderr)
                return EXIT_CANNOT_RESUME
            if finished is not None:
                print(finished, file=sys.stderr)
                return 0
            if resume is not None and _launching_process():  # once, not once per trainer rank
                print(f"resuming from {resume.describe()}", file=sys.stderr)
            return _train(config, lightning, resume, watch)
    except CheckpointDirInUse as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INVALID_CONFIG


def _train(config: SCConfig, lightning: dict[str, Any], resume: Any, watch: InterruptWatch) -> int:
    """Build the Trainer and fit, from ``resume`` (a ResumePoint) or from the start; returns the exit code."""
    from sc_lightning.models.megatron_import import import_megatron_without_compile

    import_megatron_without_compile()  # before the modules below import it
    from sc_lightning.callbacks.checkpoint import BundleCheckpoint
    from sc_lightning.callbacks.goodput import GoodputMonitor, fleet_devices
    from sc_lightning.callbacks.interrupt import InterruptCheck
    from sc_lightning.callbacks.monitor import RolloutMonitor
    from sc_lightning.callbacks.refit import RefitCallback
    from sc_lightning.callbacks.stop import FitStop
    from sc_lightning.engines.factory import default_engine_factory
    from sc_lightning.lightning.cli_parser import SCLightningCLI, trainer_world_size
    from sc_lightning.lightning.module import GRPOModule
    from sc_lightning.lightning.ppo_module import PPOModule
    from sc_lightning.lightning.strategy import single_controller_strategy

    ranks = trainer_world_size(lightning.get("trainer")) or 1
    watch.check()  # the imports above run megatron-core's bare `except:` clauses, which swallow a Ctrl-C
    stop = FitStop(config)
    callbacks: list[Any] = [stop, RefitCallback(), RolloutMonitor(), GoodputMonitor(fleet_devices(config, ranks))]
    callbacks.append(InterruptCheck(watch))
    if config.algo.validates():
        from sc_lightning.callbacks.validation import ValidationMonitor

        callbacks.append(ValidationMonitor(config.algo))  # after RefitCallback: a refit starts each validation
    if config.checkpointing.enabled:
        callbacks.append(BundleCheckpoint(config.checkpointing, max_steps=config.algo.max_num_steps))
    strategy = single_controller_strategy(
        config,
        default_engine_factory,
        ranks=ranks,
        resume_state=resume.state_dir if resume else None,
    )
    trainer = lightning.setdefault("trainer", {})
    if trainer.get("enable_checkpointing") is None:  # the parsed config names every Trainer argument, unset as None
        # with checkpointing.enabled the bundle is the run's Lightning checkpoint; without it, no Lightning default
        trainer["enable_checkpointing"] = config.checkpointing.enabled
    root = trainer.get("default_root_dir") or os.getcwd()
    if trainer.get("logger") in (None, True):  # Lightning's own default turns to TensorBoard once it is installed
        trainer["logger"] = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": root}}
    from sc_lightning.report.run_info import write_run_info

    write_run_info(root, config, lightning)  # the resolved config and versions, for `report`
    cli = SCLightningCLI(
        lightning,
        instantiate=True,
        trainer_kwargs={"strategy": strategy, "max_steps": config.algo.max_num_steps},
        trainer_defaults={"callbacks": callbacks},
    )
    ckpt_path = str(resume.trainer_checkpoint) if resume and resume.trainer_checkpoint else None
    module = PPOModule(config) if config.is_ppo else GRPOModule(config)
    watch.check()
    try:
        with lightning_interrupt(cli.trainer):
            cli.trainer.fit(module, ckpt_path=ckpt_path)
    except _bad_input_errors() as err:  # found while setting up, before anything started
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    except _cannot_resume_errors() as err:  # the checkpoint does not fit this run's models or optimizers
        print(f"error: cannot resume: {err}", file=sys.stderr)
        return EXIT_CANNOT_RESUME
    return stop.exit_code  # 0, or 128 + the signal that stopped the fit


def _bad_input_errors() -> tuple[type[Exception], ...]:
    """What a fit reports as bad input (one line, no traceback, exit code 2): the config, the dataset, the tokenizer
    or their fit, the endpoint's port. Any other error is a bug or a failure and keeps its traceback."""
    from sc_lightning.rollout.datasets import DatasetError
    from sc_lightning.rollout.serving.listen import EndpointPortError
    from sc_lightning.tokenizer import TokenizerLoadError, TokenizerMismatchError

    return ConfigError, DatasetError, TokenizerLoadError, TokenizerMismatchError, EndpointPortError


def _cannot_resume_errors() -> tuple[type[Exception], ...]:
    """What a fit reports as a checkpoint it cannot resume from (one line, no traceback, exit code 3)."""
    from sc_lightning.checkpoint.atomic import BundleError
    from sc_lightning.checkpoint.fingerprint import FingerprintMismatch
    from sc_lightning.checkpoint.snapshots import SnapshotError
    from sc_lightning.config.resume_rules import ResumeMismatch
    from sc_lightning.trainer.sharded_checkpoint import CheckpointMismatch

    return BundleError, SnapshotError, FingerprintMismatch, CheckpointMismatch, ResumeMismatch


def _resume_point(config: Any) -> Any:
    """What this run resumes from (temporaries of crashed writes are swept first), checked to fit the config; None
    for a fresh start."""
    from sc_lightning.checkpoint.resume_fit import check_resume_fits
    from sc_lightning.checkpoint.snapshots import config_identity, resume_point, sweep_temporaries

    checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
    sweep_temporaries(checkpoint_dir)
    resume = resume_point(checkpoint_dir, config.rollout_checkpointing.restore_mode, config_identity(config))
    if resume is not None:
        check_resume_fits(resume.state_dir, config)  # before any engine, Ray, data plane or model starts
    return resume


def _launching_process() -> bool:
    """Whether this is the process the user started (global rank 0): Lightning's launcher and torchrun start every
    other trainer rank as a process that runs this command again."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    return rank_zero_only.rank == 0 and os.environ.get("NODE_RANK", "0") == "0"


def _checkpoint_dir_lock(config: SCConfig) -> AbstractContextManager[Any]:
    """The checkpoint directory's lock, held for the run by the launching process only (see _launching_process)."""
    from sc_lightning.checkpoint.dir_lock import CheckpointDirLock

    if not _launching_process():
        return nullcontext()
    return CheckpointDirLock(Path(config.checkpointing.checkpoint_dir))


def load_and_check(configs: Sequence[str], overrides: Sequence[str] = ()) -> tuple[SCConfig, dict[str, Any]]:
    """Load, validate and type-check a whole config (spec sections and ``trainer:``) without starting anything.

    Returns the typed spec config and the resolved Lightning keys; raises one ConfigError listing every problem.
    Spec-section problems are found first and without importing Lightning, so a bad config fails in moments.
    """
    raw = load_yaml_layers(configs, overrides)
    try:
        config = load_config(raw, extra_top_level=LIGHTNING_KEYS)
    except ConfigError as spec_error:
        raise ConfigError(spec_error.issues + _trainer_issues(raw)) from None
    issues, lightning = [], {}
    try:
        validate_single_controller_config(config)
    except ConfigError as error:
        issues.extend(error.issues)
    try:
        lightning = parse_lightning_side(raw, config)
    except ConfigError as error:
        issues.extend(error.issues)
    if issues:
        raise ConfigError(issues)
    return config, lightning


def _trainer_issues(raw: dict[str, Any]) -> list[Any]:
    from sc_lightning.lightning.cli_parser import trainer_key_issues

    return trainer_key_issues(raw.get("trainer") or {})


def parse_lightning_side(raw: dict[str, Any], config: SCConfig) -> dict[str, Any]:
    """Check ``trainer:`` / ``seed_everything:`` through LightningCLI's own parser; returns them resolved."""
    from sc_lightning.lightning.cli_parser import parse_trainer_arguments

    lightning = {key: raw[key] for key in LIGHTNING_KEYS if key in raw}
    lightning.setdefault("seed_everything", config.algo.seed)
    return parse_trainer_arguments(lightning, config)


def render_config(config: SCConfig, lightning: dict[str, Any]) -> str:
    """The whole resolved config as YAML: Lightning's keys first, then every spec section."""
    data = {**lightning, **config_to_dict(config)}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _dry_run_summary(config: SCConfig, seconds: float) -> str:
    resolved = resolve(config)
    sampler = config.async_rl.sampler
    return (
        f"config is valid ({seconds:.1f}s; nothing was started): {config.algo_name} with the {sampler.name} "
        f"sampler, {resolved.groups_per_step} groups x {config.algo.num_generations_per_prompt} generations per "
        f"step, buffer {resolved.max_buffered_rollouts} groups, streaming threshold "
        f"{resolved.min_groups_for_streaming_train}, {config.policy.generation.backend} generation, "
        f"data plane {config.data_plane.backend}"
    )
