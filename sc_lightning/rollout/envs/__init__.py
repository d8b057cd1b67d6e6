"""Environments (reward functions) and ``build_environment``, which picks one by ``env.name``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sc_lightning.config.imports import import_class
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.rollout.envs.base import (
    Environment,
    RewardError,
    Score,
    answer_check,
    answer_extractor,
    as_score,
    request_sampling,
)
from sc_lightning.rollout.envs.clevr import ClevrEnvironment
from sc_lightning.rollout.envs.external import ExternalRewards
from sc_lightning.rollout.envs.fixed_length import FixedLengthEnvironment
from sc_lightning.rollout.envs.math import MathEnvironment
from sc_lightning.rollout.envs.worked_arithmetic import WholeSolutionEnvironment, WorkedArithmeticEnvironment

if TYPE_CHECKING:
    from sc_lightning.config.runtime import EnvConfig
    from sc_lightning.rollout.multiturn.protocol import MultiTurnEnvironment

ENVIRONMENTS: dict[str, Callable[[], Environment]] = {
    "arithmetic": ArithmeticEnvironment,
    "math": MathEnvironment,
    "clevr": ClevrEnvironment,  # questions about rendered scenes (a vision-language policy)
    "worked_arithmetic": WorkedArithmeticEnvironment,  # worked solutions of long-tailed lengths, partial credit
    "worked_arithmetic_exact": WholeSolutionEnvironment,  # the same, all or nothing (configs/grpo_1gpu_long.yaml)
    "external": ExternalRewards,  # agents post the rewards (rollout/external.py)
    "fixed_length": FixedLengthEnvironment,  # the throughput benchmark's (benchmarks/e2e.py)
}


def build_environment(cfg: EnvConfig) -> Environment | MultiTurnEnvironment:
    """The built-in environment named ``cfg.name``, or a custom class ``"package.module:ClassName"`` built without
    arguments; a multi-turn one (``cfg.is_multiturn()``) from the multi-turn registry; RewardError naming
    ``env.name`` and what is wrong otherwise."""
    if cfg.is_multiturn():
        from sc_lightning.rollout.multiturn import build_multiturn_environment  # it imports this package

        return build_multiturn_environment(cfg.name)
    if ":" in cfg.name:
        try:
            environment = import_class(cfg.name)()
        except (ValueError, TypeError) as exc:
            raise RewardError(f"env.name {cfg.name!r}: {exc}") from exc
        if not isinstance(environment, Environment):
            raise RewardError(f"env.name {cfg.name!r} is not an Environment: it needs a name and a score() method")
        return environment
    factory = ENVIRONMENTS.get(cfg.name)
    if factory is None:
        raise RewardError(
            f"unknown environment {cfg.name!r} (env.name); known: {', '.join(sorted(ENVIRONMENTS))}, or a custom "
            '"package.module:ClassName"'
        )
    return factory()


__all__ = [
    "ENVIRONMENTS",
    "ArithmeticEnvironment",
    "ClevrEnvironment",
    "Environment",
    "ExternalRewards",
    "FixedLengthEnvironment",
    "MathEnvironment",
    "RewardError",
    "Score",
    "WholeSolutionEnvironment",
    "WorkedArithmeticEnvironment",
    "answer_check",
    "answer_extractor",
    "as_score",
    "build_environment",
    "request_sampling",
]
