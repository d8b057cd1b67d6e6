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


def integer_answer(answer: str | None) -> int:
    """The integer an answer states; RewardError when there is none or it is not an integer (``"7.0"`` is not)."""
    if answer is None:
        raise RewardError("the arithmetic environment needs an answer, got None")
    try:
        return int(answer.strip())
    except ValueError:
        raise RewardError(f"the arithmetic answer must be an integer, got {answer!r}") from None


def expected_integer(prompt: Prompt) -> int:
    """The integer answer of an arithmetic prompt; RewardError naming the prompt when it has none or it is not one."""
    try:
        return integer_answer(prompt.answer)
    except RewardError as err:
        raise RewardError(f"prompt {prompt.prompt_id}: {err}") from None


class ArithmeticEnvironment:
    """Reward 1.0 when the completion's leading integer equals the prompt's answer, else 0.0.

    Leading whitespace is skipped; the integer is an optional sign followed by digits and ends at the first other
    character, so ``" 12"``, ``"12 "`` and ``"12=3"`` all read as 12 while ``"123"`` reads as 123.
    """

    name: str = "arithmetic"

    def check_answer(self, answer: str | None) -> None:
        """RewardError when ``answer`` is not an integer (checked as the dataset loads)."""
        integer_answer(answer)

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """1.0 for the right leading integer, 0.0 otherwise (including no integer at all)."""
        expected = expected_integer(prompt)
        return 1.0 if leading_integer(completion_text) == expected else 0.0

    def extract_answer(self, completion_text: str) -> str | None:
        """The leading integer the score compares, as text; None when the completion starts with none."""
        found = leading_integer(completion_text)
        return None if found is None else str(found)

    def __repr__(self) -> str:
        return "ArithmeticEnvironment()"
