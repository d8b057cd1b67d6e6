"""Helpers for config tests: load + validate a raw config, and collect its error paths and texts."""

from __future__ import annotations

from typing import Any

from sc_lightning.cli.load import LIGHTNING_KEYS
from sc_lightning.config import ConfigError, check_config, load_config

PPO_COMPANION: dict[str, Any] = {
    # What the spec says a PPO run needs on top of the tiny GRPO config: ppo: instead of grpo:, value:,
    # value_loss_fn:, the gae estimator, a Megatron critic, offload_optimizer_for_logprob, whole-step chunks.
    "grpo": None,
    "ppo": {
        "num_prompts_per_step": 4,
        "num_generations_per_prompt": 4,
        "max_num_steps": 30,
        "max_num_epochs": 100,
        "adv_estimator": {"name": "gae"},
        "ppo_epochs": 1,
    },
    "value": {"train_global_batch_size": 16, "megatron_cfg": {"enabled": True}, "precision": "fp32"},
    "value_loss_fn": {"value_clip_epsilon": 0.2},
    "policy": {"offload_optimizer_for_logprob": True},
}


def errors_of(raw: dict[str, Any]) -> list[str]:
    """Every error ("path: message") the loader and the rules report for ``raw``; [] when valid."""
    try:
        config = load_config(raw, extra_top_level=LIGHTNING_KEYS)
    except ConfigError as error:
        return [str(issue) for issue in error.issues]
    return [str(issue) for issue in check_config(config).errors]


def warnings_of(raw: dict[str, Any]) -> list[str]:
    """Every warning the rules report for a loadable ``raw``."""
    return [str(issue) for issue in check_config(load_config(raw, extra_top_level=LIGHTNING_KEYS)).warnings]
