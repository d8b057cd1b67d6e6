"""Reward scaling and DAPO's overlong shaping, applied to a scored group before anything reads its rewards.

For a completion of ``L`` response tokens with the environment's reward ``r``:

1. **Scaling** (``{algo}.reward_scaling``): ``r`` is clamped to ``[source_min, source_max]`` and mapped linearly
   onto ``[target_min, target_max]``::

       r = target_min + (clamp(r, source_min, source_max) - source_min) / (source_max - source_min)
                        * (target_max - target_min)

2. **Overlong shaping** (``{algo}.reward_shaping``, DAPO's soft overlong punishment): with the length limit
   ``L_max`` (``max_response_length``, by default ``policy.generation.max_new_tokens``; a multi-turn run gives it,
   as a conversation's limit counts its prompt too), the buffer ``B``
   (``overlong_buffer_length``) and the penalty ``P`` (``overlong_buffer_penalty``), a completion longer than
   ``L_max - B`` loses a share of ``P`` growing linearly over the buffer, all of it at the limit (and more past
   it, where ``L_max`` is below the generation limit)::

       r += min(0, -(L - (L_max - B)) / B * P)        (B = 0: -P once L > L_max)

Both run on the rollout side as the group is scored (before dynamic sampling's filter, the commit and the
advantages), so the rows, the trainer's advantages and ``train/reward`` hold the shaped reward; validation scores
raw rewards. ``L`` is the completion's token count (a multi-turn conversation's: every token after the prompt).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sc_lightning.config import SCConfig
from sc_lightning.config.resolved import response_limit
from sc_lightning.types import ScoredGroup


@dataclass(frozen=True)
class RewardScale:
    """Clamp to the source range, then map it linearly onto the target range."""

    source_min: float
    source_max: float
    target_min: float
    target_max: float

    def __call__(self, reward: float) -> float:
        """The scaled ``reward``."""
        clamped = min(max(reward, self.source_min), self.source_max)
        share = (clamped - self.source_min) / (self.source_max - self.source_min)
        return self.target_min + share * (self.target_max - self.target_min)


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's soft overlong punishment over the last ``buffer_length`` tokens before ``max_response_length``."""

    max_response_length: int
    buffer_length: int
    penalty: float

    def __call__(self, length: int) -> float:
        """The (non-positive) amount added to the reward of a completion of ``length`` tokens."""
        over = length - (self.max_response_length - self.buffer_length)
        if over <= 0:
            return 0.0
        if self.buffer_length == 0:
            return -self.penalty
        return -over / self.buffer_length * self.penalty


@dataclass(frozen=True)
class RewardTransform:
    """Scaling, then overlong shaping, of every reward of a scored group (either may be off)."""

    scale: RewardScale | None = None
    overlong: OverlongPenalty | None = None

    def reward(self, reward: float, length: int) -> float:
        """The transformed reward of a completion of ``length`` tokens whose environment reward is ``reward``."""
        if self.scale is not None:
            reward = self.scale(reward)
        if self.overlong is not None:
            reward += self.overlong(length)
        return reward

    def __call__(self, group: ScoredGroup) -> ScoredGroup:
        """``group`` with each reward transformed."""
        rewards = tuple(self.reward(r, len(g.token_ids)) for r, g in zip(group.rewards, group.generations, strict=True))
        return dataclasses.replace(group, rewards=rewards)


def reward_transform(config: SCConfig) -> RewardTransform | None:
    """The run's reward transform from ``{algo}.reward_scaling`` and ``{algo}.reward_shaping`` (None: both off)."""
    scaling, shaping = config.algo.reward_scaling, config.algo.reward_shaping
    scale = overlong = None
    if scaling.enabled:
        scale = RewardScale(scaling.source_min, scaling.source_max, scaling.target_min, scaling.target_max)
    if shaping.enabled:
        assert shaping.overlong_buffer_length is not None and shaping.overlong_buffer_penalty is not None  # rules
        buffer, penalty = shaping.overlong_buffer_length, shaping.overlong_buffer_penalty
        overlong = OverlongPenalty(response_limit(config), buffer, penalty)
    return None if scale is None and overlong is None else RewardTransform(scale, overlong)
