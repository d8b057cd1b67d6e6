"""The synthetic verifiable task: single-digit addition ``"a+b="``, scored by exact match of the leading integer."""

from __future__ import annotations

import re

from sc_lightning.rollout.envs.base import RewardError
from sc_lightning.types import Prompt

_LEADING_INT = re.compile(r"[+-]?\d+")


def leading_integer(text: str) -> int | None:
    """The integer that ``text`` starts with after leading whitespace (an optional sign, then digits), or None."""
    match = _LEADING_INT.match(text.lstrip())
    return int(match.group()) if match else None


def expected_integer(prompt: Prompt) -> int:
    """The integer answer of an arithmetic prompt; RewardError when it has none or it is not an integer."""
    if prompt.answer is None:
        raise RewardError(f"prompt {prompt.prompt_id}: the arithmetic environment needs an answer, got None")
    try:
        return int(prompt.answer.strip())
    except ValueError:
        raise RewardError(
            f"prompt {prompt.prompt_id}: the arithmetic answer must be an integer, got {prompt.answer!r}"
        ) from None


class ArithmeticEnvironment:
    """Reward 1.0 when the completion's leading integer equals the prompt's answer, else 0.0.

    Leading whitespace is skipped; the integer is an optional sign followed by digits and ends at the first other
    character, so ``" 12"``, ``"12 "`` and ``"12=3"`` all read as 12 while ``"123"`` reads as 123.
    """

    name: str = "arithmetic"

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """1.0 for the right leading integer, 0.0 otherwise (including no integer at all)."""
        expected = expected_integer(prompt)
        return 1.0 if leading_integer(completion_text) == expected else 0.0

    def __repr__(self) -> str:
        return "ArithmeticEnvironment()"
