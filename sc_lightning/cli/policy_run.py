"""What the one-pass commands (``validate``, ``generate``) share: a policy — the config's initial one, or a checkpoint
bundle's — brought up as ``fit`` brings it up, one callback that acts once the engine holds it, and no training step.

- :func:`take_options` takes a command's own options out of its arguments (the rest are ``fit``'s: ``--config``
  files and ``--a.b.c VALUE`` overrides, so ``--policy.model_name HF_DIR`` starts from a Hugging Face directory);
- :func:`run_on_policy` loads and checks the config (exit 2 on a problem, before anything starts), checks the
  ``--ckpt_path`` bundle as a resume checks it (exit 3 for a damaged bundle or one that does not fit), then runs the
  command's body, reporting bad input met on the way (a dataset, a tokenizer: exit 2) and a bundle whose models do
  not fit (exit 3) in one ``error:`` line;
- :func:`fit_once` is the fit such a body runs: the Trainer (from ``trainer:``) with the Single-Controller strategy
  on one rank, the policy restored from the bundle exactly as a resume restores it, and ``max_steps`` the bundle's
  step, so the fit ends before any training step. The rollout pump starts with the controller, as in a fit; what it
  generates meanwhile is discarded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_lightning.checkpoint.bundle import TRAINER_FILE
from sc_lightning.cli.args import FitRequest, UsageError, take_value
from sc_lightning.cli.exits import EXIT_CANNOT_RESUME, EXIT_INVALID_CONFIG, bad_input_errors, cannot_resume_errors
from sc_lightning.cli.load import load_and_check
from sc_lightning.config import ConfigError, SCConfig
from sc_lightning.interrupt import lightning_interrupt
from sc_lightning.preflight import check_preflight

_FLAG_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class PolicyRun:
    """A checked config, its Lightning sections and the bundle whose policy to load (None: the initial policy)."""

    config: SCConfig
    lightning: dict[str, Any]
    bundle: Path | None

    @property
    def step(self) -> int:
        """The RL step the bundle was written at (its controller state's trainer version); 0 without one."""
        if self.bundle is None:
            return 0
        from sc_lightning.checkpoint.bundle import read_controller_state

        return int(read_controller_state(self.bundle)["trainer_version"])

    @property
    def root(self) -> Path:
        """Where the command writes: ``trainer.default_root_dir``, else the working directory."""
        return Path((self.lightning.get("trainer") or {}).get("default_root_dir") or os.getcwd())


def take_options(
    args: Sequence[str], valued: Sequence[str], flags: Sequence[str] = ()
) -> tuple[dict[str, str], list[str]]:
    """The options named in ``valued`` (``--name VALUE`` or ``--name=VALUE``) and ``flags`` (alone, or followed by
    true/false) as ``{name: value}``, and the other arguments in order; UsageError for a missing or bad value."""
    options: dict[str, str] = {}
    rest: list[str] = []
    pending = list(args)
    while pending:
        arg = pending.pop(0)
        key, eq, value = arg.partition("=")
        if key in valued:
            options[key] = value if eq else take_value(key, pending)
        elif key in flags:
            if not eq and pending and pending[0].lower() in _FLAG_WORDS:
                value, eq = pending.pop(0), "="
            if eq and value.lower() not in _FLAG_WORDS:
                raise UsageError(f"{key} takes true or false, got {value!r}")
            options[key] = "true" if not eq or _FLAG_WORDS[value.lower()] else "false"
        else:
            rest.append(arg)
    return options, rest


def run_on_policy(
    ckpt_path: str | None,
    request: FitRequest,
    body: Callable[[PolicyRun], int],
    *,
    adjust: Callable[[SCConfig], SCConfig] | None = None,
) -> int:
    """Check the config (then ``adjust`` it, which may raise ConfigError) and the bundle ``ckpt_path`` names, then run
    ``body``; returns the exit code (see the module docstring)."""
    from sc_lightning.checkpoint.atomic import verify_bundle
    from sc_lightning.checkpoint.resume_fit import check_resume_fits
    from sc_lightning.console import quiet_libraries

    quiet_libraries()  # before megatron, Lightning or Ray is imported
    try:
        config, lightning = load_and_check(request.configs, request.overrides)
        config = adjust(config) if adjust is not None else config
        check_preflight(config, lightning.get("trainer") or {})
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    bundle = None if ckpt_path is None else bundle_directory(Path(ckpt_path))
    if ckpt_path is not None and bundle is None:
        print(f"error: --ckpt_path {ckpt_path}: {not_a_bundle(Path(ckpt_path))}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    try:
        if bundle is not None:
            verify_bundle(bundle)  # as fit checks the bundle it resumes from
            check_resume_fits(bundle, config)
        return body(PolicyRun(config, lightning, bundle))
    except bad_input_errors() as err:  # a dataset, a tokenizer: found while setting up
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    except cannot_resume_errors() as err:  # the bundle is damaged, or does not fit this config
        print(f"error: cannot resume: {err}", file=sys.stderr)
        return EXIT_CANNOT_RESUME


def bundle_directory(path: Path) -> Path | None:
    """The bundle ``--ckpt_path`` names: the directory itself or its trainer checkpoint; None if it is neither."""
    directory = path.parent if path.name == TRAINER_FILE else path
    return directory if (directory / TRAINER_FILE).is_file() else None


def not_a_bundle(path: Path) -> str:
    """Why ``--ckpt_path`` ``path`` names no bundle, and what to give instead."""
    if not path.exists():
        return "no such file or directory; give a bundle directory (checkpointing.checkpoint_dir/step_N)"
    return f"not a checkpoint bundle (no {TRAINER_FILE}); give a bundle directory (checkpointing.checkpoint_dir/step_N)"


def fit_once(run: PolicyRun, callback: Any) -> None:
    """Bring up ``run``'s policy and engine in a Lightning fit that ends before any training step; ``callback`` (a
    Lightning Callback) acts in it, at ``on_fit_start``. ``run.lightning``'s ``trainer:`` is used as given (its
    logger too), with Lightning's checkpointing off and, unless ``trainer:`` asks for it, no model summary."""
    from sc_lightning.models.megatron_import import import_megatron_without_compile

    import_megatron_without_compile()  # before the modules below import it
    from sc_lightning.cli.parser import SCLightningCLI
    from sc_lightning.engines.factory import default_engine_factory
    from sc_lightning.lightning.module import GRPOModule
    from sc_lightning.lightning.ppo_module import PPOModule
    from sc_lightning.lightning.strategy import single_controller_strategy

    trainer = run.lightning.setdefault("trainer", {})
    trainer["enable_checkpointing"] = False
    if trainer.get("enable_model_summary") is None:  # unset: stdout is the command's result, not the model's table
        trainer["enable_model_summary"] = False
    strategy = single_controller_strategy(run.config, default_engine_factory, ranks=1)
    cli = SCLightningCLI(
        run.lightning,
        instantiate=True,
        trainer_kwargs={"strategy": strategy, "max_steps": run.step},  # stop before any training step
        trainer_defaults={"callbacks": [callback]},
    )
    module = PPOModule(run.config) if run.config.is_ppo else GRPOModule(run.config)
    with lightning_interrupt(cli.trainer):  # a Ctrl-C: main() says so and exits 130
        cli.trainer.fit(module, ckpt_path=None if run.bundle is None else str(run.bundle / TRAINER_FILE))
