"""The recovery ledger's entries: prompt groups taken from the dataset but not committed, and how to redispatch them.

Each entry keeps its prompt, its target step, the *granularity* resolved when the prompt left the dataset, and —
with ``token_capture.enabled`` and ``sibling`` granularity — the generations already finished (sealed):

- ``sibling``: a redispatch keeps the sealed generations and generates only the missing ones;
- ``prompt_group``: a redispatch generates every generation again (one weight version for the whole group).

Resolution, per prompt: ``agent_granularity_overrides[agent_ref.name]``, then
``task_source_granularity_overrides[task_source]``, then ``default_granularity``. The prompt's ``extra`` (or its
``extra_env_info``) carries ``agent_ref`` (a mapping with ``name``, or a name) and ``task_source``. The resolved
value is persisted with the entry, so a restart never reinterprets an existing group under a changed config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sc_lightning.config.runtime import Granularity, RolloutRecoveryConfig
from sc_lightning.types import Generation, Prompt, prompt_from_dict, prompt_to_dict


@dataclass
class PendingGroup:
    """A ledger entry; ``sealed`` (generation index → generation) is None when nothing is captured."""

    prompt: Prompt
    target_step: int | None
    granularity: Granularity
    sealed: dict[int, Generation] | None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``rollout_recovery.pt`` (loadable with ``torch.load(weights_only=True)``)."""
        sealed = None
        if self.sealed is not None:
            sealed = [
                {
                    "index": index,
                    "token_ids": list(g.token_ids),
                    "logprobs": list(g.logprobs),
                    "finish_reason": g.finish_reason,
                    "weight_version": g.weight_version,
                    "token_versions": list(g.token_versions),
                    "trainable": list(g.trainable),
                }
                for index, g in sorted(self.sealed.items())
            ]
        return {
            "prompt": prompt_to_dict(self.prompt),
            "target_step": self.target_step,
            "granularity": self.granularity,
            "sealed": sealed,
        }

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any], *, capture: bool) -> PendingGroup:
        """An entry as saved; its sealed generations are kept only for ``sibling`` with token capture on."""
        granularity = entry.get("granularity", "sibling")
        keep = capture and granularity == "sibling"
        sealed = {
            int(g["index"]): Generation(
                tuple(g["token_ids"]),
                tuple(g["logprobs"]),
                g["finish_reason"],
                int(g["weight_version"]),
                tuple(int(v) for v in g.get("token_versions", ())),  # absent in a ledger from before them
                tuple(bool(t) for t in g.get("trainable", ())),  # absent before multi-turn rollouts: all trainable
            )
            for g in (entry.get("sealed") or [])
        }
        return cls(prompt_from_dict(entry["prompt"]), entry["target_step"], granularity, sealed if keep else None)


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
        sealed = {} if self.token_capture and granularity == "sibling" else None
        return PendingGroup(prompt, target_step, granularity, sealed)
