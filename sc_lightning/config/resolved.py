"""Values derived from a config: the capacities and counts that null knobs default to."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sc_lightning.config.samplers import WindowedSamplerConfig
from sc_lightning.config.schema import SCConfig


@dataclass(frozen=True)
class Resolved:
    """The effective capacity settings of a run, with every null knob replaced by its documented default."""

    groups_per_step: int
    required_buffer_capacity: int | None
    max_buffered_rollouts: int
    min_groups_for_streaming_train: int
    max_inflight_prompts: int


def step_floor(groups_per_step: int, min_step_batch_fraction: float) -> int:
    """The fewest groups a step shrunk by dropped rollouts may keep: ``ceil(N x fraction)``, at least 1."""
    return max(1, math.ceil(groups_per_step * min_step_batch_fraction))


def gated_buffer_capacity(groups_per_step: int, gate_window: int) -> int:
    """The buffer a gated sampler needs: one step's groups for each version dispatch may lead by, plus the current."""
    return groups_per_step * (gate_window + 1)


def required_buffer_capacity(config: SCConfig) -> int | None:
    """Smallest ``max_buffered_rollouts`` that cannot deadlock the rollout pump (None: checked at setup)."""
    n = config.algo.num_prompts_per_step
    sampler = config.async_rl.sampler
    window = sampler.gate_window()
    if window is not None:
        return gated_buffer_capacity(n, window)
    if isinstance(sampler, WindowedSamplerConfig):
        # Dispatch is ungated, but the trainer waits for min_groups ready groups: fewer permits never get there.
        return min_groups_for_streaming_train(config)
    return None


def min_groups_for_streaming_train(config: SCConfig) -> int:
    """Ready groups the trainer waits for before a chunk (default: the whole step)."""
    value = config.async_rl.min_groups_for_streaming_train
    return value if value is not None else config.algo.num_prompts_per_step


def default_buffer_capacity(config: SCConfig) -> int:
    """``max_buffered_rollouts`` when left null: the gated capacity, or twice the window for windowed."""
    sampler = config.async_rl.sampler
    n = config.algo.num_prompts_per_step
    if isinstance(sampler, WindowedSamplerConfig):
        return 2 * n * (sampler.max_staleness_versions + 1)
    return required_buffer_capacity(config) or n


def resolve(config: SCConfig) -> Resolved:
    """Effective capacities of ``config`` (call after validation)."""
    n = config.algo.num_prompts_per_step
    buffered = config.async_rl.max_buffered_rollouts or default_buffer_capacity(config)
    return Resolved(
        groups_per_step=n,
        required_buffer_capacity=required_buffer_capacity(config),
        max_buffered_rollouts=buffered,
        min_groups_for_streaming_train=min_groups_for_streaming_train(config),
        max_inflight_prompts=config.async_rl.max_inflight_prompts or buffered,
    )


def response_limit(config: SCConfig) -> int:
    """The length the overlong penalty is measured against: ``max_response_length``, else the longest completion
    (``policy.generation.max_new_tokens``; a multi-turn run must give ``max_response_length``, a rule says)."""
    shaping = config.algo.reward_shaping
    if shaping.max_response_length is not None:
        return shaping.max_response_length
    return config.policy.generation.max_new_tokens
