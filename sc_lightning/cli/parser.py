"""The ``trainer:`` side of a config, parsed by LightningCLI itself so every Trainer argument is type-checked."""

from __future__ import annotations

import argparse
import inspect
import warnings
from typing import Any

import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.accelerators import AcceleratorRegistry, CUDAAccelerator
from lightning.pytorch.cli import LightningCLI

from sc_lightning.config import ConfigError, ConfigIssue, SCConfig
from sc_lightning.config.knobs import closest


class _ParseOnlyModule(LightningModule):
    """Stands in for the module while only the trainer arguments are parsed; never instantiated."""


class SCLightningCLI(LightningCLI):
    """LightningCLI over the Lightning keys of a config (``trainer:``, ``seed_everything:``).

    The spec sections are loaded by :func:`sc_lightning.config.load_config`; this CLI parses and type-checks the
    rest with Lightning's own parser. With ``instantiate=False`` it parses only and builds nothing.
    """

    def __init__(
        self,
        lightning_args: dict[str, Any],
        *,
        instantiate: bool = False,
        trainer_kwargs: dict[str, Any] | None = None,
        trainer_defaults: dict[str, Any] | None = None,
    ) -> None:
        self._instantiate = instantiate
        self._trainer_kwargs = trainer_kwargs or {}
        super().__init__(
            model_class=_ParseOnlyModule,
            run=False,
            args=lightning_args,
            auto_configure_optimizers=False,
            save_config_callback=None,
            trainer_defaults=trainer_defaults,
            parser_kwargs={"exit_on_error": False},
        )

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The Trainer from the config's ``trainer:`` arguments, with sc_lightning's own settings on top."""
        return super().instantiate_trainer(**{**self._trainer_kwargs, **kwargs})

    def _set_seed(self) -> None:
        """Seed only when the run is built; parsing a config must not touch global RNG state."""
        if self._instantiate:
            super()._set_seed()

    def instantiate_classes(self) -> None:
        """Build the Trainer only when asked to; a parse-only CLI starts nothing."""
        if self._instantiate:
            super().instantiate_classes()


def parse_trainer_arguments(lightning: dict[str, Any], config: SCConfig) -> dict[str, Any]:
    """Type-check the Lightning keys; returns them fully resolved. Raises ConfigError naming every problem."""
    issues = [
        *trainer_key_issues(lightning.get("trainer") or {}),
        *_accelerator_name_issues(lightning),
        *_step_budget_issues(lightning, config),
        *_checkpointing_issues(lightning, config),
        *_precision_issues(lightning, config),
        *_parallel_layout_issues(lightning, config),
    ]
    if issues:
        raise ConfigError(issues)
    try:
        with warnings.catch_warnings():
            # We hand LightningCLI the merged config as `args` while sys.argv also holds our own options.
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            cli = SCLightningCLI(lightning)
    except argparse.ArgumentError as exc:
        raise ConfigError([ConfigIssue("trainer", " ".join(str(exc).split()))]) from None
    dumped = yaml.safe_load(cli.parser.dump(cli.config, skip_none=False))
    return {key: dumped[key] for key in ("seed_everything", "trainer") if key in dumped}


def trainer_key_issues(trainer: Any) -> list[ConfigIssue]:
    """Unknown Trainer arguments, each with the closest real one."""
    if not isinstance(trainer, dict):
        return [ConfigIssue("trainer", f"expected a mapping of Lightning Trainer arguments, got {trainer!r}")]
    known = list(inspect.signature(Trainer.__init__).parameters)[1:]
    issues = []
    for key in trainer:
        if key not in known:
            guess = closest(str(key), known)
            hint = f"; did you mean trainer.{guess}?" if guess else "; see lightning.pytorch.Trainer's arguments"
            issues.append(ConfigIssue(f"trainer.{key}", f"unknown Trainer argument{hint}"))
    return issues


def _accelerator_name_issues(lightning: dict[str, Any]) -> list[ConfigIssue]:
    """An accelerator name Lightning does not know (Lightning itself finds it only when the Trainer is built)."""
    trainer = lightning.get("trainer") or {}
    accelerator = trainer.get("accelerator") if isinstance(trainer, dict) else None
    known = ["auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators())]
    if not isinstance(accelerator, str) or accelerator in known:
        return []
    guess = closest(accelerator, known)
    hint = f"did you mean {guess}? " if guess else ""
    return [
        ConfigIssue(
            "trainer.accelerator", f"is {accelerator!r}, which Lightning does not know; {hint}known: {', '.join(known)}"
        )
    ]


_RUN_LENGTH_KNOBS = {  # Trainer arguments that would end (or hold) a fit by Lightning epochs or batch counts
    "max_epochs": (None, -1),
    "min_epochs": (None, 0),
    "min_steps": (None, -1, 0),
    "limit_train_batches": (None, 1.0),
}


def _step_budget_issues(lightning: dict[str, Any], config: SCConfig) -> list[ConfigIssue]:
    """The run's length is ``<algo>.max_num_steps`` (and ``trainer.max_time`` per fit command): the whole RL run is
    one Lightning epoch, so the Trainer's epoch and batch limits would not do what they say (see docs/training.md)."""
    trainer = lightning.get("trainer") or {}
    if not isinstance(trainer, dict):
        return []
    budget, algo = config.algo.max_num_steps, config.algo_name
    issues = []
    max_steps = trainer.get("max_steps")
    if max_steps not in (None, -1, budget):
        issues.append(
            ConfigIssue(
                "trainer.max_steps",
                f"is {max_steps} but {algo}.max_num_steps is {budget}; the RL step budget is set by "
                f"{algo}.max_num_steps, delete trainer.max_steps",
            )
        )
    for knob, neutral in _RUN_LENGTH_KNOBS.items():
        value = trainer.get(knob)
        if not any(value == n and type(value) is type(n) for n in neutral):  # 1 (one batch) is not 1.0 (all)
            issues.append(
                ConfigIssue(
                    f"trainer.{knob}",
                    f"is {value!r}, but the whole RL run is one Lightning epoch of {algo}.max_num_steps steps, so "
                    f"it cannot end a fit where it says; set {algo}.max_num_steps (the run's length, "
                    f"{algo}.max_num_epochs for passes over the dataset) or trainer.max_time (a limit per fit "
                    f"command), and delete trainer.{knob}",
                )
            )
    return issues


def _checkpointing_issues(lightning: dict[str, Any], config: SCConfig) -> list[ConfigIssue]:
    trainer = lightning.get("trainer") or {}
    if not isinstance(trainer, dict) or trainer.get("enable_checkpointing") is not False:
        return []
    if not config.checkpointing.enabled:
        return []
    return [
        ConfigIssue(
            "trainer.enable_checkpointing",
            "is false but checkpointing.enabled is true: sc_lightning's bundles are written by a Lightning "
            "checkpoint callback (BundleCheckpoint); delete trainer.enable_checkpointing",
        )
    ]


def _precision_issues(lightning: dict[str, Any], config: SCConfig) -> list[ConfigIssue]:
    """bf16 models on a CPU trainer: mixed precision (fp32 master weights) runs on CUDA only."""
    trainer = lightning.get("trainer") or {}
    accelerator = str(trainer.get("accelerator", "auto")) if isinstance(trainer, dict) else "auto"
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not CUDAAccelerator.is_available())
    models = [("policy.precision", config.policy.precision)]
    if config.value is not None:
        models.append(("value.precision", config.value.precision))
    return [
        ConfigIssue(
            knob,
            f"is bf16 but the trainer runs on the CPU (trainer.accelerator: {accelerator}): bf16 trains through "
            "megatron-core's mixed-precision optimizer, which needs a GPU; set it to fp32 for a CPU run",
        )
        for knob, precision in models
        if on_cpu and precision == "bf16"
    ]


def _device_count(devices: Any) -> int | None:
    """How many devices per node ``trainer.devices`` asks for, or None where Lightning resolves it (``auto``, -1)."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    text = str(devices).strip()
    if "," in text:
        return len([part for part in text.split(",") if part.strip()])
    return int(text) if text.isdigit() and int(text) > 0 else None


def trainer_world_size(trainer: Any) -> int | None:
    """The trainer ranks ``trainer.devices`` x ``trainer.num_nodes`` ask for; None where Lightning resolves it
    (``devices: auto`` or -1)."""
    if not isinstance(trainer, dict):
        return None
    devices, nodes = _device_count(trainer.get("devices", "auto")), trainer.get("num_nodes", 1)
    if devices is None or not isinstance(nodes, int) or nodes < 1:
        return None
    return devices * nodes


def _parallel_layout_issues(lightning: dict[str, Any], config: SCConfig) -> list[ConfigIssue]:
    """A model's TP x PP ranks must divide the trainer's world (``trainer.devices`` x ``trainer.num_nodes``); several
    ranks read their rows from a data plane they can all reach."""
    trainer = lightning.get("trainer") or {}
    world = trainer_world_size(trainer)
    if world is None:
        return []
    where = f"trainer.devices {trainer.get('devices')} x trainer.num_nodes {trainer.get('num_nodes', 1)}"
    issues = []
    for model in ("policy", "value"):
        section = getattr(config, model)
        if section is None:
            continue
        tp = section.megatron_cfg.tensor_model_parallel_size
        pp = section.megatron_cfg.pipeline_model_parallel_size
        if world % (tp * pp):
            issues.append(
                ConfigIssue(
                    f"{model}.megatron_cfg.tensor_model_parallel_size",
                    f"is {tp} (x pipeline_model_parallel_size {pp}) but the trainer has {world} rank(s) ({where}), "
                    "which it does not divide; choose sizes whose product divides the world size",
                )
            )
    if world > 1 and config.data_plane.backend == "memory":
        issues.append(
            ConfigIssue(
                "data_plane.backend",
                f"is memory (in-process) but the trainer has {world} ranks ({where}), and every rank reads its "
                "own rows from the data plane by key; set data_plane.backend: simple (TransferQueue), which every "
                "rank reaches",
            )
        )
    return issues
