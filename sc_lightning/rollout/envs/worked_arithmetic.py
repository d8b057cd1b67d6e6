"""The worked-arithmetic verifiers: the share of the worked solution's lines written before the first slip, 1 for the
whole solution, ending in the answer (``worked_arithmetic``); or all or nothing (``worked_arithmetic_exact``).

The task (:mod:`sc_lightning.tasks.worked_arithmetic`): ``"0023-7="`` asks for 23 minus 7 while at least 7 remains,
one line per subtraction written units digit first, ``6100 9000 2000`` (16, 9, 2); the last line is the answer
(``23 mod 7``).
"""

from __future__ import annotations

from sc_lightning.rollout.envs.arithmetic import expected_integer, integer_answer
from sc_lightning.rollout.envs.base import RewardError
from sc_lightning.tasks.worked_arithmetic import WorkedProblem, credit, final_answer, is_right, parse_prompt
from sc_lightning.types import Prompt


def worked_problem(prompt: Prompt) -> WorkedProblem:
    """The problem a prompt poses, checked against its answer; RewardError naming the prompt when its text is no
    worked-arithmetic problem or its answer is not that problem's."""
    try:
        problem = parse_prompt(prompt.text)
    except ValueError as err:
        raise RewardError(f"prompt {prompt.prompt_id}: {err}") from None
    if expected_integer(prompt) != int(problem.answer):
        raise RewardError(
            f"prompt {prompt.prompt_id}: its answer {prompt.answer!r} is not {problem.prompt!r}'s ({problem.answer})"
        )
    return problem


class WorkedArithmeticEnvironment:
    """Reward: the share of the worked solution's lines the completion writes (split at whitespace) before its first
    slip, 1.0 only when it is exactly the solution (:func:`~sc_lightning.tasks.worked_arithmetic.credit`).

    Its last line is then the answer; a right last line without the work before it scores 0 (and after wrong work,
    only the lines before the first wrong one), so no shortcut shortens the answers.
    """

    name: str = "worked_arithmetic"

    def check_answer(self, answer: str | None) -> None:
        """RewardError when ``answer`` is not an integer (checked as the dataset loads)."""
        integer_answer(answer)

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """1.0 for the whole worked solution, else the share of its lines written before the first slip."""
        return credit(worked_problem(prompt), completion_text)

    def extract_answer(self, completion_text: str) -> str | None:
        """The completion's last line read back as a number is written (its final answer, ``"2000"`` -> ``"0002"``),
        or None for an empty completion."""
        return final_answer(completion_text)

    def __repr__(self) -> str:
        return "WorkedArithmeticEnvironment()"


class WholeSolutionEnvironment(WorkedArithmeticEnvironment):
    """Reward: 1.0 for exactly the worked solution, else 0.0 (no partial credit).

    With partial credit a completion that slips later than its group-mates gets a positive advantage, and its slip
    (a low-probability token, so the one with the largest gradient) is pushed up with it; all or nothing rewards
    only whole solutions, so every slip a step trains on is pushed down.
    """

    name: str = "worked_arithmetic_exact"

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """1.0 for the whole worked solution, else 0.0."""
        return float(is_right(worked_problem(prompt), completion_text))

    def __repr__(self) -> str:
        return "WholeSolutionEnvironment()"
