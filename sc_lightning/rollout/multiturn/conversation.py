"""The record of one multi-turn rollout: every token of the conversation, which ones are trained, and their versions.

Pure data (stdlib only). A :class:`Conversation` is built turn by turn by a :class:`ConversationAssembler` from the
prompt's token ids, the model's generations (one per model turn) and the environment's observation token ids.
Every per-token array has one entry per token of ``token_ids``:

- ``trainable``: True for tokens the model sampled (its turns), False for prompt and environment tokens.
- ``logprobs``: the engine's log-probability for model tokens; 0.0 for prompt and environment tokens (never read:
  the loss only looks at trainable tokens).
- ``token_versions``: the weight version that sampled each model token (its turn's ``Generation.token_versions``;
  a refit between or within turns shows up as a change of version); an environment token carries the version of the
  model turn it follows, and prompt tokens carry -1 (no model produced them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

TurnRole = Literal["prompt", "model", "env"]
NO_VERSION = -1  # the version of prompt tokens: no weights produced them


class ModelTurn(Protocol):
    """What the assembler needs of one model turn; :class:`sc_lightning.types.Generation` has it."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_version: int
    token_versions: tuple[int, ...]


@dataclass(frozen=True)
class TurnSpan:
    """One turn's tokens: ``token_ids[start:end]`` of the conversation, produced by ``role``."""

    role: TurnRole
    start: int
    end: int


@dataclass(frozen=True)
class Conversation:
    """A whole multi-turn rollout as one token sequence with aligned per-token arrays (see the module doc)."""

    token_ids: tuple[int, ...]
    trainable: tuple[bool, ...]
    logprobs: tuple[float, ...]
    token_versions: tuple[int, ...]
    turns: tuple[TurnSpan, ...]

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        lengths = {"trainable": len(self.trainable), "logprobs": len(self.logprobs)}
        lengths["token_versions"] = len(self.token_versions)
        wrong = {name: size for name, size in lengths.items() if size != n}
        if wrong:
            raise ValueError(f"a conversation of {n} tokens needs {n} entries per array, got {wrong}")
        position = 0
        for span in self.turns:
            if span.start != position or span.end < span.start:
                raise ValueError(f"turn {span} does not continue the conversation at token {position}")
            position = span.end
        if position != n:
            raise ValueError(f"the turns cover {position} tokens of a conversation of {n}")

    @property
    def prompt_length(self) -> int:
        """Number of leading prompt tokens (the first turn's)."""
        return self.turns[0].end if self.turns and self.turns[0].role == "prompt" else 0

    @property
    def model_turns(self) -> int:
        """How many turns the model took."""
        return sum(span.role == "model" for span in self.turns)


class ConversationAssembler:
    """Builds a :class:`Conversation` incrementally: the prompt, then model turns and observations in any order."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self._ids: list[int] = []
        self._trainable: list[bool] = []
        self._logprobs: list[float] = []
        self._versions: list[int] = []
        self._turns: list[TurnSpan] = []
        self._last_version = NO_VERSION
        self._append("prompt", prompt_ids, trainable=False, logprobs=None, versions=(NO_VERSION,) * len(prompt_ids))

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The conversation's tokens so far (what the next model turn is conditioned on)."""
        return tuple(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def add_model_turn(self, turn: ModelTurn) -> None:
        """Append a model turn: its tokens are trainable, with their logprobs and the turn's weight version."""
        if len(turn.token_ids) != len(turn.logprobs):
            raise ValueError(
                f"model turn {self.model_turns + 1}: {len(turn.token_ids)} tokens but {len(turn.logprobs)} logprobs"
            )
        versions = turn.token_versions or (turn.weight_version,) * len(turn.token_ids)
        self._last_version = versions[-1] if versions else turn.weight_version
        self._append("model", turn.token_ids, trainable=True, logprobs=turn.logprobs, versions=versions)

    def add_observation(self, token_ids: Sequence[int]) -> None:
        """Append environment tokens: not trainable, carrying the version of the model turn they follow."""
        self._append("env", token_ids, trainable=False, logprobs=None, versions=(self._last_version,) * len(token_ids))

    @property
    def model_turns(self) -> int:
        """How many model turns were added."""
        return sum(span.role == "model" for span in self._turns)

    def build(self) -> Conversation:
        """The conversation so far as an immutable record."""
        return Conversation(
            tuple(self._ids), tuple(self._trainable), tuple(self._logprobs), tuple(self._versions), tuple(self._turns)
        )

    def _append(
        self,
        role: TurnRole,
        ids: Sequence[int],
        *,
        trainable: bool,
        logprobs: Sequence[float] | None,
        versions: Sequence[int],
    ) -> None:
        start = len(self._ids)
        self._ids.extend(int(i) for i in ids)
        self._trainable.extend([trainable] * len(ids))
        self._logprobs.extend([float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids))
        self._versions.extend(int(v) for v in versions)
        self._turns.append(TurnSpan(role, start, len(self._ids)))
