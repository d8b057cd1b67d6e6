"""The multi-turn environment contract: after each model turn, an observation to append or a final reward.

An environment starts one :class:`Episode` per conversation (``start(prompt)``: the episode may keep state across
turns); ``Episode.step(model_text)`` returns an :class:`Observation` (appended to the conversation as a ``tool`` or
``user`` message, after which the model takes another turn) or a final verdict, a number or a
:class:`~sc_lightning.rollout.envs.base.Score` (whose ``mask_sample`` keeps the whole conversation out of the loss).
:class:`TurnLimits` bound a conversation by model turns and by tokens; a conversation that hits either ends with
reward 0 (the model did not answer in time). ``build_multiturn_environment`` picks an environment by name like
``env.name`` does for single-turn ones: a built-in name or a custom ``"package.module:ClassName"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sc_lightning.config.imports import import_class
from sc_lightning.rollout.envs.base import RewardError, Score
from sc_lightning.rollout.multiturn.chat import Role
from sc_lightning.types import Prompt

if TYPE_CHECKING:
    from sc_lightning.config.runtime import EnvConfig


@dataclass(frozen=True)
class Observation:
    """What the environment shows the model after its turn: ``text`` appended as a ``role`` message."""

    text: str
    role: Role = "tool"


@runtime_checkable
class Episode(Protocol):
    """One conversation's environment state; the driver calls ``step`` once per model turn."""

    def step(self, model_text: str) -> Observation | float | Score:
        """An observation to continue the conversation with, or the final reward of the conversation."""


@runtime_checkable
class MultiTurnEnvironment(Protocol):
    """Starts an :class:`Episode` per conversation; raises RewardError for a prompt it cannot verify."""

    name: str

    def start(self, prompt: Prompt) -> Episode:
        """A fresh episode for ``prompt``."""


@dataclass(frozen=True)
class TurnLimits:
    """How long a conversation may run: ``max_turns`` model turns and ``max_tokens`` tokens in all (prompt too)."""

    max_turns: int = 4
    max_tokens: int = 256

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_tokens < 1:
            raise ValueError(
                f"turn limits must be positive, got max_turns={self.max_turns}, max_tokens={self.max_tokens}"
            )

    @classmethod
    def from_env_config(cls, env_cfg: EnvConfig) -> TurnLimits:
        """The limits from ``env.max_turns`` and ``env.max_conversation_tokens``."""
        return cls(max_turns=env_cfg.max_turns, max_tokens=env_cfg.max_conversation_tokens)


MULTITURN_ENVIRONMENTS: dict[str, Callable[[], MultiTurnEnvironment]] = {}


def register_multiturn_environment(name: str, factory: Callable[[], MultiTurnEnvironment]) -> None:
    """Make ``factory`` the built-in multi-turn environment called ``name``."""
    MULTITURN_ENVIRONMENTS[name] = factory


def build_multiturn_environment(name: str) -> MultiTurnEnvironment:
    """The built-in multi-turn environment ``name`` or a custom class ``"package.module:ClassName"`` built without
    arguments; RewardError naming ``env.name`` and what is wrong otherwise."""
    if ":" in name:
        try:
            environment = import_class(name)()
        except (ValueError, TypeError) as exc:
            raise RewardError(f"env.name {name!r}: {exc}") from exc
        if not isinstance(environment, MultiTurnEnvironment):
            raise RewardError(f"env.name {name!r} is not a multi-turn environment: it needs a name and start()")
        return environment
    factory = MULTITURN_ENVIRONMENTS.get(name)
    if factory is None:
        raise RewardError(
            f"unknown multi-turn environment {name!r} (env.name); known: {', '.join(sorted(MULTITURN_ENVIRONMENTS))}, "
            'or a custom "package.module:ClassName"'
        )
    return factory()
