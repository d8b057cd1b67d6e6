"""``env.name: external``: rewards come from external agents, so nothing scores completions in-process."""

from __future__ import annotations

from sc_lightning.rollout.envs.base import RewardError
from sc_lightning.types import Prompt


class ExternalRewards:
    """The environment of external-agent runs: every sample is scored by its agent's posted reward.

    The rollout manager never asks it (each sample of :class:`~sc_lightning.rollout.external.ExternalRollouts`
    carries its own score); a caller that does gets a RewardError naming the mode.
    """

    name = "external"

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """Refuse: rewards come from agents (``POST /v1/rollouts/{rollout_id}/reward``)."""
        raise RewardError(
            f"prompt {prompt.prompt_id}: env.name external scores nothing in-process; agents post each rollout's "
            "reward to POST /v1/rollouts/{rollout_id}/reward"
        )
