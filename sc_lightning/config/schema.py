"""The root config: one typed section per top-level key of the spec, loaded with :func:`load_config`.

Every knob the spec names exists under the spec's dotpath. Loading raises
:class:`~sc_lightning.config.knobs.ConfigError` listing every unknown key (with the closest known key), wrong type
and out-of-range value at once; cross-field rules live in :mod:`sc_lightning.config.validate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sc_lightning.config.algorithm import GRPOConfig, LossConfig, PPOConfig, ValueLossConfig
from sc_lightning.config.distillation import DistillationConfig
from sc_lightning.config.knobs import ConfigError, build_section, key_index, knob, section, to_plain
from sc_lightning.config.model import PolicyConfig, ValueConfig
from sc_lightning.config.runtime import (
    AsyncRLConfig,
    CheckpointingConfig,
    DataConfig,
    DataPlaneConfig,
    EnvConfig,
    RolloutCheckpointingConfig,
    RolloutRecoveryConfig,
    TokenCaptureConfig,
)


@section
class SCConfig:
    """A whole sc_lightning run: algorithm, models, losses, async runtime, data plane and checkpointing."""

    grpo: GRPOConfig | None = knob(None, "GRPO algorithm block; exactly one of grpo / ppo.")
    ppo: PPOConfig | None = knob(None, "PPO algorithm block; exactly one of grpo / ppo.")
    policy: PolicyConfig = knob(doc="Policy model, trainer and generation engine.", factory=PolicyConfig)
    value: ValueConfig | None = knob(None, "PPO critic (required on PPO, forbidden on GRPO).")
    loss_fn: LossConfig = knob(doc="Policy loss.", factory=LossConfig)
    value_loss_fn: ValueLossConfig | None = knob(None, "PPO critic loss (required on PPO, forbidden on GRPO).")
    async_rl: AsyncRLConfig = knob(doc="Async runtime: sampler, capacity, failures, watchdog.", factory=AsyncRLConfig)
    data_plane: DataPlaneConfig = knob(doc="Rollout data plane.", factory=DataPlaneConfig)
    checkpointing: CheckpointingConfig = knob(doc="Trainer checkpoints.", factory=CheckpointingConfig)
    rollout_checkpointing: RolloutCheckpointingConfig = knob(
        doc="Periodic rollout snapshots.", factory=RolloutCheckpointingConfig
    )
    token_capture: TokenCaptureConfig = knob(doc="Token capture for sibling recovery.", factory=TokenCaptureConfig)
    rollout_recovery: RolloutRecoveryConfig = knob(doc="Redispatch granularity.", factory=RolloutRecoveryConfig)
    data: DataConfig = knob(doc="Prompt dataset.", factory=DataConfig)
    env: EnvConfig = knob(doc="Reward environment.", factory=EnvConfig)
    on_policy_distillation: DistillationConfig | None = knob(
        None, "Teachers of on-policy distillation (required by, and only with, grpo.adv_estimator.name: opd)."
    )

    @property
    def has_one_algorithm(self) -> bool:
        """Whether exactly one of grpo / ppo is present (rules that read the block check this first)."""
        return (self.grpo is None) != (self.ppo is None)

    @property
    def algo(self) -> GRPOConfig | PPOConfig:
        """The algorithm block that is present (``grpo`` or ``ppo``)."""
        block = self.grpo if self.grpo is not None else self.ppo
        if block is None:
            raise ValueError("config has neither a grpo: nor a ppo: block")
        return block

    @property
    def algo_name(self) -> str:
        """``"grpo"`` or ``"ppo"``: the dotpath prefix of the algorithm block."""
        return "grpo" if self.grpo is not None else "ppo"

    @property
    def distills(self) -> bool:
        """Whether this is an on-policy distillation run (``grpo.adv_estimator.name: opd`` with its teachers)."""
        block = self.on_policy_distillation
        return self.grpo is not None and block is not None and self.grpo.adv_estimator.name == "opd"

    @property
    def is_ppo(self) -> bool:
        """Whether this is a PPO run."""
        return self.ppo is not None and self.grpo is None


SECTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SCConfig))


def load_config(raw: Mapping[str, Any] | None, *, extra_top_level: tuple[str, ...] = ()) -> SCConfig:
    """Build an :class:`SCConfig` from raw YAML data; raises ConfigError naming every bad key or value.

    ``extra_top_level`` names top-level keys that belong to someone else (the CLI passes Lightning's ``trainer``
    and friends) and are skipped here.
    """
    raw = dict(raw or {})
    spec_part = {k: v for k, v in raw.items() if k not in extra_top_level}
    config, issues = build_section(SCConfig, spec_part, "", index=key_index(SCConfig))
    if issues:
        raise ConfigError(issues)
    return config


def config_to_dict(config: SCConfig) -> dict[str, Any]:
    """The fully resolved config (defaults included) as plain YAML-ready data."""
    return to_plain(config)
