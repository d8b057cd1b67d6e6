"""The tiny CLEVR verifier: reward 1 when the completion's first word is exactly the answer.

The task (:mod:`sc_lightning.tasks.clevr`): a 32x32 scene of coloured shapes and a question about it in codes
(``+1=`` asks how many green objects there are; ``-052=`` whether the red object is left of the blue one); every
answer is one digit, scored alike whatever the question's kind.
"""

from __future__ import annotations

from sc_lightning.rollout.envs.base import RewardError
from sc_lightning.tasks.clevr import first_word
from sc_lightning.types import Prompt


class ClevrEnvironment:
    """Reward 1.0 when the completion's first whitespace-separated word equals the prompt's answer, else 0.0
    (``"2"`` and ``" 2 more"`` read as ``2``; ``"23"`` does not)."""

    name: str = "clevr"

    def check_answer(self, answer: str | None) -> None:
        """RewardError when ``answer`` is no single word (checked as the dataset loads)."""
        if answer is None or len(answer.split()) != 1:
            raise RewardError(f"the clevr answer must be one word, got {answer!r}")

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """1.0 for the right first word, 0.0 otherwise (an empty completion included)."""
        if prompt.answer is None:
            raise RewardError(f"prompt {prompt.prompt_id}: the clevr environment needs an answer, got None")
        return 1.0 if first_word(completion_text) == prompt.answer.strip() else 0.0

    def extract_answer(self, completion_text: str) -> str | None:
        """The completion's first word, the answer the score compares; None for an empty completion."""
        return first_word(completion_text)

    def __repr__(self) -> str:
        return "ClevrEnvironment()"
