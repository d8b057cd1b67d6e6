"""Small builders for rule-test configs: the tiny config varied one section at a time."""

from __future__ import annotations

from typing import Any

from tests.config.helpers import PPO_COMPANION
from tests.helpers.configs import variant

NON_COLOCATED = {"policy": {"generation": {"colocated": {"enabled": False}}}}
VLLM = {"policy": {"generation": {"backend": "vllm", "colocated": {"enabled": False}}}}
CUSTOM = "tests.config.custom_samplers"


def ppo(*layers: dict[str, Any]) -> dict[str, Any]:
    """The tiny config turned into the spec's PPO run, with ``layers`` on top."""
    return variant(PPO_COMPANION, *layers)


def sampler(**knobs: Any) -> dict[str, Any]:
    return {"async_rl": {"sampler": knobs}}


def async_rl(**knobs: Any) -> dict[str, Any]:
    return {"async_rl": knobs}


def ckpt(**knobs: Any) -> dict[str, Any]:
    return {"checkpointing": knobs}


SNAPSHOTS = {
    "checkpointing": {"enabled": True, "save_data_plane": True, "save_period": 1},
    "rollout_checkpointing": {"snapshot_attempt_interval_s": 120, "keep_latest_k": 2},
    "token_capture": {"enabled": True},
}

# (rule, passing config, failing config, dotpath in the error, text in the error)
