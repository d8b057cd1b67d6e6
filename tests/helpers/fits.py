"""Real Lightning fits of the tiny config in one process: the tests' Trainer, the GRPO and PPO configs, a fit over
the FAKE scripted engine, and a callback that records Lightning's hooks."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch import Callback, Trainer

from sc_lightning.config import SCConfig, load_config
from sc_lightning.config.yaml_io import apply_override, load_yaml_layers, merge_into
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.models.warm_start import resolve_model_name
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.config.helpers import PPO_COMPANION
from tests.helpers.configs import TEST_BASE
from tests.helpers.scripts import Alternating

if TYPE_CHECKING:
    from sc_lightning.engines.megatron.engine import MegatronEngine


def tiny_trainer(
    config: Any,
    engine_factory: Callable[..., Any],
    callbacks: Sequence[Any] = (),
    *,
    root: Path | None = None,
    resume_state: Path | None = None,
    max_steps: int | None = None,
    accelerator: str = "auto",
) -> Any:
    """The tests' one Trainer: the Single-Controller strategy over ``engine_factory``, RefitCallback, RolloutMonitor,
    ``callbacks``.

    Quiet (no logger, progress bar or model summary); Lightning's checkpointing is on only when ``callbacks`` hold a
    checkpoint callback (a BundleCheckpoint or ModelCheckpoint). ``max_steps`` defaults to the config's budget.
    Without ``root`` the run's files (samples/, on by default) go to a fresh temporary directory, never the working
    directory (Lightning's default, here the repository).
    """
    from lightning.pytorch.callbacks import Checkpoint

    from sc_lightning import RefitCallback, RolloutMonitor, SingleControllerStrategy

    return Trainer(
        strategy=SingleControllerStrategy(config, engine_factory, resume_state=resume_state),
        accelerator=accelerator,
        default_root_dir=root if root is not None else tempfile.mkdtemp(prefix="sc_lightning_fit_"),
        max_steps=config.algo.max_num_steps if max_steps is None else max_steps,
        logger=False,
        enable_checkpointing=any(isinstance(callback, Checkpoint) for callback in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RefitCallback(), RolloutMonitor(), *callbacks],
    )


def tiny_config(*overrides: str) -> SCConfig:
    """The tests' base config, in-process data plane, 3 steps, with ``overrides`` (``key=value``) on top."""
    raw = load_yaml_layers(TEST_BASE, ["data_plane.backend=memory", "grpo.max_num_steps=3", *overrides])
    return load_config(raw, extra_top_level=("trainer", "seed_everything"))


def fit(
    config: SCConfig,
    callbacks: list[Callback],
    root: Path | None = None,
    ckpt_path: str | None = None,
    engine: ScriptedEngine | None = None,
    module_class: type[GRPOModule] = GRPOModule,
) -> tuple[Trainer, GRPOModule]:
    """A real fit of ``module_class`` over ``engine`` (by default the FAKE engine scripted :class:`Alternating`);
    the trainer and the module."""
    engine = engine or ScriptedEngine(Alternating())
    trainer = tiny_trainer(config, lambda c, w: engine, callbacks, root=root)
    module = module_class(config)
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer, module


class Recorder(Callback):
    """Records every hook Lightning calls on a callback, in order, and the step metrics."""

    HOOKS = (
        "setup",
        "on_fit_start",
        "on_train_start",
        "on_train_epoch_start",
        "on_train_batch_start",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_train_batch_end",
        "on_train_epoch_end",
        "on_train_end",
        "on_fit_end",
        "teardown",
    )

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.step_metrics: list[dict[str, float]] = []
        for name in self.HOOKS:
            setattr(self, name, self._record(name))

    def _record(self, name: str):
        def hook(trainer, pl_module, *args, **kwargs) -> None:
            if name == "on_train_batch_end":
                self.step_metrics.append({k: float(v) for k, v in args[0].items()})
            if not self.calls or self.calls[-1] != name:  # collapse per-micro-batch repeats
                self.calls.append(name)

        return hook


def ppo_config(*overrides: str) -> SCConfig:
    """The tests' tiny base as the spec's PPO run (4 prompts x 4 generations), in-process data plane."""
    raw = load_yaml_layers(TEST_BASE, ["data_plane.backend=memory"])
    merge_into(raw, copy.deepcopy(PPO_COMPANION))
    raw["ppo"]["max_num_steps"] = 3
    raw["value"]["model_name"] = raw["policy"]["model_name"]
    for override in overrides:
        apply_override(raw, override)
    return load_config(raw, extra_top_level=("trainer", "seed_everything"))


def megatron_engine_factory(config: SCConfig, weights: Any) -> MegatronEngine:
    """An engine factory for :func:`tiny_trainer`: the real Megatron engine, warm-started as the policy is."""
    from sc_lightning.engines.megatron.engine import MegatronEngine

    seed = config.algo.seed
    return MegatronEngine.from_pretrained(resolve_model_name(config.policy.model_name, seed=seed), seed=seed)
