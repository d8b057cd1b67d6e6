"""What every prompt dataset shares: the protocol, the error, the length check and the list they are held in."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from sc_lightning.config.runtime import BUILTIN_DATASETS
from sc_lightning.types import Prompt

BUILTIN_NAMES = {"data.dataset_name": BUILTIN_DATASETS, "data.val_dataset_name": ("arithmetic-val",)}
"""The built-in datasets each dataset knob may name instead of a path."""
AnswerCheck = Callable[[str | None], object]
"""An environment's ``check_answer``: raises a ValueError (its RewardError) for an answer it could never score."""
LISTED_BAD_ROWS = 5
"""How many bad rows a DatasetError over ``data.max_skipped_rows`` lists (with the total count)."""


class DatasetError(ValueError):
    """A dataset cannot be loaded: unknown name, unreadable file, bad record, or a prompt over the length limit."""


@runtime_checkable
class PromptDataset(Protocol):
    """A finite, indexable collection of prompts."""

    def __len__(self) -> int:
        """Number of prompts."""

    def __getitem__(self, index: int) -> Prompt:
        """The prompt at ``index`` (0 <= index < len)."""


def prompt_length_problem(token_ids: Sequence[int], max_prompt_length: int | None) -> str | None:
    """Why a prompt of ``token_ids`` is too long (``"has N tokens, more than ..."``), or None (None = no limit)."""
    if max_prompt_length is not None and len(token_ids) > max_prompt_length:
        return f"has {len(token_ids)} tokens, more than data.max_prompt_length={max_prompt_length}"
    return None


def check_prompt_length(prompt: Prompt, max_prompt_length: int | None, source: str = "") -> None:
    """DatasetError naming the prompt when it has more than ``max_prompt_length`` tokens (None = no limit)."""
    problem = prompt_length_problem(prompt.token_ids, max_prompt_length)
    if problem:
        where = f" in {source}" if source else ""
        raise DatasetError(f"prompt {prompt.prompt_id}{where} {problem}")


class ListDataset:
    """Prompts held in a list (the built-in datasets and the files' prompts are small enough to build eagerly)."""

    _prompts: list[Prompt]

    def __len__(self) -> int:
        return len(self._prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self._prompts[index]

    def __iter__(self) -> Iterator[Prompt]:
        return iter(self._prompts)
