"""A conversation's progress under token capture: its sealed turns, then its outcome, kept across interruptions.

With ``token_capture.enabled`` (and ``sibling`` granularity) each multi-turn sample of a prompt group has a
:class:`TurnRecord` in its recovery-ledger entry (``PendingGroup.conversations``, by sample index). A model turn is
*sealed* (appended to ``turns``) once the environment's observation answering it is part of the conversation; the
whole sample once the conversation ends (``generation`` and ``score``). A conversation interrupted by a retry, an
eviction (its task cancelled) or a kill (the record is in the snapshot's ``rollout_recovery.pt``) is played again
from its record: the sealed turns keep their tokens, logprobs and per-token versions, and only the turn after them is
generated again. The driver replays the sealed turns through a fresh episode, so the environment's state is rebuilt;
an episode that answers a replayed turn differently is a :class:`ReplayDiverged`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sc_lightning.rollout.envs.base import Score
from sc_lightning.rollout.multiturn.protocol import Observation
from sc_lightning.types import Generation, generation_from_dict, generation_to_dict


class ReplayDiverged(RuntimeError):
    """A fresh episode answered a sealed turn differently from the recorded observation; names prompt and turn."""


@dataclass(frozen=True)
class SealedTurn:
    """One finished turn: the model's generation and the environment's observation that answered it."""

    generation: Generation
    observation: Observation


@dataclass
class TurnRecord:
    """One conversation's sealed turns and, once it ended, its whole generation and score (see the module doc)."""

    turns: list[SealedTurn] = field(default_factory=list)
    generation: Generation | None = None
    score: Score | None = None

    @property
    def model_token_count(self) -> int:
        """The model tokens the record keeps (the whole conversation's once finished, else the sealed turns')."""
        if self.generation is not None:
            return self.generation.model_token_count
        return sum(turn.generation.model_token_count for turn in self.turns)

    @property
    def oldest_version(self) -> int | None:
        """The weight version of the first model token kept (None: nothing kept yet)."""
        if self.generation is not None:
            return self.generation.weight_version
        return self.turns[0].generation.weight_version if self.turns else None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``rollout_recovery.pt`` (loadable with ``torch.load(weights_only=True)``)."""
        return {
            "turns": [
                {
                    **generation_to_dict(t.generation),
                    "observation": {"role": t.observation.role, "text": t.observation.text},
                }
                for t in self.turns
            ],
            "generation": None if self.generation is None else generation_to_dict(self.generation),
            "score": None
            if self.score is None
            else {"reward": self.score.reward, "mask_sample": self.score.mask_sample},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnRecord:
        """The record :meth:`to_dict` wrote."""
        turns = [
            SealedTurn(generation_from_dict(t), Observation(t["observation"]["text"], t["observation"]["role"]))
            for t in data["turns"]
        ]
        generation = None if data["generation"] is None else generation_from_dict(data["generation"])
        score = (
            None if data["score"] is None else Score(float(data["score"]["reward"]), bool(data["score"]["mask_sample"]))
        )
        return cls(turns, generation, score)
