"""``python -m sc_lightning fit --config x.yaml``: check a config, then build the run and train it.

The config is loaded and checked by :mod:`sc_lightning.cli.load` (every error at once, before anything starts);
``--print_config`` prints it resolved and ``--dry_run`` stops after the checks. A fit builds the Lightning Trainer
(from ``trainer:``, through :mod:`sc_lightning.cli.parser`) with the Single-Controller strategy and sc_lightning's
callbacks, holds the checkpoint directory and resumes from its newest bundle.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from sc_lightning.cli.args import FIT_USAGE, UsageError, fit_help, parse_fit_arguments
from sc_lightning.cli.exits import (
    EXIT_CANNOT_RESUME,
    EXIT_INVALID_CONFIG,
    bad_input_errors,
    cannot_resume_errors,
    usage_error,
)
from sc_lightning.cli.load import load_and_check, render_config
from sc_lightning.config import ConfigError, SCConfig, resolve
from sc_lightning.console import quiet_libraries
from sc_lightning.interrupt import InterruptWatch, lightning_interrupt
from sc_lightning.preflight import check_preflight


def fit_command(args: list[str]) -> int:
    """``fit``: validate the config, then train (or only print the resolved config, or only check it)."""
    try:
        request = parse_fit_arguments(args)
    except UsageError as exc:
        return usage_error(FIT_USAGE, str(exc))
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
    from sc_lightning.local_ray import disconnect_ray, ray_connected

    caller_ray = ray_connected()  # a caller's connection (an in-process caller's) stays theirs
    code = fit(config, lightning, watch)
    if not caller_ray:
        disconnect_ray()  # the run's own: now, not in Ray's exit hook after its half-second pause
    return code


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
            except cannot_resume_errors() as err:  # nothing was deleted or rewritten
                print(f"error: cannot resume: {err}", file=sys.stderr)
                return EXIT_CANNOT_RESUME
            if finished is not None:
                print(finished, file=sys.stderr)
                return _export_at_end(config, 0)
            if resume is not None and _launching_process():  # once, not once per trainer rank
                print(f"resuming from {resume.describe()}", file=sys.stderr)
            return _export_at_end(config, _train(config, lightning, resume, watch))
    except CheckpointDirInUse as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INVALID_CONFIG


def _train(config: SCConfig, lightning: dict[str, Any], resume: Any, watch: InterruptWatch) -> int:
    """Build the Trainer and fit, from ``resume`` (a ResumePoint) or from the start; returns the exit code."""
    from sc_lightning.models.megatron_import import import_megatron_without_compile

    import_megatron_without_compile()  # before the modules below import it
    from sc_lightning.callbacks.checkpoint import BundleCheckpoint
    from sc_lightning.callbacks.goodput import GoodputMonitor, fleet_devices, lookahead_of
    from sc_lightning.callbacks.interrupt import InterruptCheck
    from sc_lightning.callbacks.monitor import RolloutMonitor
    from sc_lightning.callbacks.refit import RefitCallback
    from sc_lightning.callbacks.stop import FitStop
    from sc_lightning.cli.parser import SCLightningCLI, trainer_world_size
    from sc_lightning.controller.api import WaitInterrupted
    from sc_lightning.engines.factory import default_engine_factory
    from sc_lightning.lightning.module import GRPOModule
    from sc_lightning.lightning.ppo_module import PPOModule
    from sc_lightning.lightning.strategy import single_controller_strategy

    ranks = trainer_world_size(lightning.get("trainer")) or 1
    watch.check()  # the imports above run megatron-core's bare `except:` clauses, which swallow a Ctrl-C
    stop = FitStop(config)
    goodput = GoodputMonitor(fleet_devices(config, ranks), *lookahead_of(config.async_rl.sampler))
    callbacks: list[Any] = [stop, RefitCallback(), RolloutMonitor(), goodput]
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
    except bad_input_errors() as err:  # found while setting up, before anything started
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    except cannot_resume_errors() as err:  # the checkpoint does not fit this run's models or optimizers
        print(f"error: cannot resume: {err}", file=sys.stderr)
        return EXIT_CANNOT_RESUME
    except WaitInterrupted:  # a stop signal ended a step's wait for rollouts: FitStop has said so
        if stop.signal is None:
            raise
    return stop.exit_code  # 0, or 128 + the signal that stopped the fit


def _export_at_end(config: SCConfig, exit_code: int) -> int:
    """With ``checkpointing.export_hf_at_end``, after a fit that ended well (``exit_code`` 0; not by a stop signal),
    the launching process exports the final bundle's policy; returns the command's exit code."""
    if exit_code != 0 or not config.checkpointing.export_hf_at_end or not _launching_process():
        return exit_code
    from sc_lightning.cli.export import export_final_bundle

    return export_final_bundle(Path(config.checkpointing.checkpoint_dir))


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
