"""The rollout side's small pieces: what it reads of the trained model, how it builds the engine, the optional parts
a config asks for (the OpenAI-compatible endpoint, external agents' rollouts, periodic rollout snapshots), and the
record of the last refit."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from sc_lightning.checkpoint.periodic import RolloutSnapshotter
from sc_lightning.checkpoint.snapshots import config_identity
from sc_lightning.config import SCConfig
from sc_lightning.controller.api import RefitReport
from sc_lightning.engines.base import GenerationEngine
from sc_lightning.engines.decode_counters import DecodeCounters
from sc_lightning.rollout.external import ExternalRollouts

EngineFactory = Callable[[SCConfig, list[tuple[str, torch.Tensor]]], GenerationEngine]
"""Builds the generation engine from the config and the policy's initial (HF-named) weights."""


class PolicyModel(Protocol):
    """What the rollout side reads of the trained model (a ``GRPOModule`` is one): the policy, its spec, its
    tokenizer."""

    @property
    def policy(self) -> torch.nn.Module | None:
        """The megatron-core policy being trained (its weights are what a refit pushes)."""
        ...

    @property
    def spec(self) -> Any:
        """The policy's architecture (:class:`~sc_lightning.models.spec.ModelSpec`): how its weights map to HF."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer: the dataset's prompts are encoded with it, its pad id pads the training rows."""
        ...


@dataclass(frozen=True)
class RefitRecord:
    """The last refit: the version it published, the controller's report, how long it took, when it ended, the RL
    step's wall time (from the previous refit's end, or the fit's start, to this one's end), and the engines' decode
    counters as the refit began (None where the engines count none)."""

    version: int
    report: RefitReport
    duration_s: float
    finished_at: float  # time.monotonic()
    step_s: float
    decode: DecodeCounters | None = None


def _endpoint_block(config: SCConfig) -> tuple[str, Any]:
    """The chosen backend's endpoint knobs: their dotpath prefix and their block."""
    generation = config.policy.generation
    if generation.backend == "vllm":
        return "policy.generation.vllm_cfg.", generation.vllm_cfg
    return "policy.generation.mcore_generation_config.", generation.mcore_generation_config


def http_server_port(config: SCConfig) -> int | None:
    """The port of the OpenAI-compatible endpoint (0: a free one), or None when the config serves none (the knobs
    of the chosen backend)."""
    settings = _endpoint_block(config)[1]
    return settings.http_port if settings.expose_http_server else None


def http_knobs(config: SCConfig) -> str:
    """The dotpath prefix of the endpoint's knobs of the chosen backend (``...mcore_generation_config.``)."""
    return _endpoint_block(config)[0]


def http_host(config: SCConfig) -> str:
    """The address the endpoint binds (``http_host`` of the chosen backend)."""
    return _endpoint_block(config)[1].http_host


def http_api_key_variable(config: SCConfig) -> str:
    """The environment variable that holds the endpoint's API key (``http_api_key_env`` of the chosen backend)."""
    return _endpoint_block(config)[1].http_api_key_env


def http_api_key(config: SCConfig) -> str | None:
    """The endpoint's API key, from the environment variable ``http_api_key_env`` names (None: unset or empty)."""
    return os.environ.get(http_api_key_variable(config)) or None


def external_rollouts(config: SCConfig, engine: GenerationEngine) -> ExternalRollouts | None:
    """The external agents' rollout registry when ``env.name`` is ``external`` (served by the endpoint), else None."""
    if config.env.name != "external":
        return None
    return ExternalRollouts(max_total_tokens=config.policy.max_total_sequence_length, engine_name=engine.name)


def rollout_snapshotter(config: SCConfig) -> RolloutSnapshotter | None:
    """The periodic rollout snapshotter ``rollout_checkpointing`` asks for, or None."""
    settings = config.rollout_checkpointing
    if settings.snapshot_attempt_interval_s is None:
        return None
    return RolloutSnapshotter(
        checkpoint_dir=Path(config.checkpointing.checkpoint_dir),
        interval_s=settings.snapshot_attempt_interval_s,
        keep_latest_k=settings.keep_latest_k,
        max_consecutive_failures=settings.max_consecutive_failures,
        identity=config_identity(config),
    )
