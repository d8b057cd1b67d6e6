"""The recovery ledger's entries: prompt groups taken from the dataset but not committed, and how to redispatch them.

Each entry keeps its prompt, its target step, the *granularity* resolved when the prompt left the dataset, and —
with ``token_capture.enabled`` and ``sibling`` granularity — the generations already finished (sealed), and each
multi-turn conversation's sealed turns (``conversations``, :mod:`sc_lightning.rollout.multiturn.record`):

- ``sibling``: a redispatch keeps the sealed generations and generates only the missing ones; a conversation goes
  on after its last sealed turn;
- ``prompt_group``: a redispatch generates every generation again (one weight version for the whole group).

Resolution, per prompt: ``agent_granularity_overrides[agent_ref.name]``, then
``task_source_granularity_overrides[task_source]``, then ``default_granularity``. The prompt's ``extra`` (or its
``extra_env_info``) carries ``agent_ref`` (a mapping with ``name``, or a name) and ``task_source``. The resolved
value is persisted with the entry, so a restart never reinterprets an existing group under a changed config.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sc_lightning.config.runtime import Granularity, RolloutRecoveryConfig
from sc_lightning.rollout.multiturn.record import TurnRecord
from sc_lightning.types import (
    Generation,
    Prompt,
    generation_from_dict,
    generation_to_dict,
    prompt_from_dict,
    prompt_to_dict,
)


@dataclass
class PendingGroup:
    """A ledger entry; ``sealed`` (generation index → generation) and ``conversations`` (sample index → its
    conversation's record, made on first use) are None when nothing is captured."""

    prompt: Prompt
    target_step: int | None
    granularity: Granularity
    sealed: dict[int, Generation] | None
    conversations: dict[int, TurnRecord] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``rollout_recovery.pt`` (loadable with ``torch.load(weights_only=True)``)."""
        sealed = None
        if self.sealed is not None:
            sealed = [{"index": index, **generation_to_dict(g)} for index, g in sorted(self.sealed.items())]
        conversations = None
        if self.conversations is not None:
            conversations = [
                {"index": index, **record.to_dict()}
                for index, record in sorted(self.conversations.items())
                if record.turns or record.generation is not None
            ]
        return {
            "prompt": prompt_to_dict(self.prompt),
            "target_step": self.target_step,
            "granularity": self.granularity,
            "sealed": sealed,
            "conversations": conversations,
        }

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any], *, capture: bool) -> PendingGroup:
        """An entry as saved; its sealed generations and conversation turns are kept only for ``sibling`` with token
        capture on (an entry saved before conversations were recorded has none)."""
        granularity = entry.get("granularity", "sibling")
        prompt = prompt_from_dict(entry["prompt"])
        if not (capture and granularity == "sibling"):
            return cls(prompt, entry["target_step"], granularity, None)
        sealed = {int(g["index"]): generation_from_dict(g) for g in (entry.get("sealed") or [])}
        conversations = defaultdict(
            TurnRecord, {int(c["index"]): TurnRecord.from_dict(c) for c in (entry.get("conversations") or [])}
        )
        return cls(prompt, entry["target_step"], granularity, sealed, conversations)


@dataclass(frozen=True)
class RecoveryPolicy:
    """Resolves a prompt's recovery granularity and whether its finished generations are captured."""

    config: RolloutRecoveryConfig
    token_capture: bool

    def granularity_for(self, prompt: Prompt) -> Granularity:
        """Agent override, then task-source override, then the default."""
        info = prompt.extra.get("extra_env_info", prompt.extra)
        agent = info.get("agent_ref") if isinstance(info, Mapping) else None
        agent_name = agent.get("name") if isinstance(agent, Mapping) else agent
        task_source = info.get("task_source") if isinstance(info, Mapping) else None
        for what, value in (("agent_ref name", agent_name), ("task_source", task_source)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"prompt {prompt.prompt_id}: its {what} must be a string, got {type(value).__name__}")
        if agent_name in self.config.agent_granularity_overrides:
            return self.config.agent_granularity_overrides[agent_name]
        if task_source in self.config.task_source_granularity_overrides:
            return self.config.task_source_granularity_overrides[task_source]
        return self.config.default_granularity

    def pending(self, prompt: Prompt, target_step: int | None) -> PendingGroup:
        """A new ledger entry for a prompt just taken from the dataset."""
        granularity = self.granularity_for(prompt)
        if not (self.token_capture and granularity == "sibling"):
            return PendingGroup(prompt, target_step, granularity, None)
        return PendingGroup(prompt, target_step, granularity, {}, defaultdict(TurnRecord))
