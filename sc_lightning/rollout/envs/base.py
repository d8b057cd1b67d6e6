"""The environment contract: a synchronous, pure reward function of a prompt and one completion's text."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sc_lightning.types import Prompt


class RewardError(ValueError):
    """An environment cannot score: an unknown environment name, or a prompt it cannot verify against.

    Raised for problems of the configuration or the data (e.g. a prompt without an answer), never for a badly
    formed completion: model output that cannot be parsed scores 0.0.
    """


@runtime_checkable
class Environment(Protocol):
    """Scores completions of prompts; the rollout manager calls ``score`` in a worker thread under a deadline."""

    name: str

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """Reward of ``completion_text`` as an answer to ``prompt``; raises RewardError only for a bad prompt."""
