"""The worked-arithmetic task: a remainder found by repeated subtraction, every subtraction written out.

The problem ``"0023-7="`` asks for 23 minus 7, minus 7 again, and so on while the result is at least 7, each result
written as a line of :data:`WIDTH` digits (zero-padded) with the units digit first, and the lines joined by single
spaces; the last line is the answer, ``23 mod 7``::

    0023-7=  ->  6100 9000 2000        (16, 9, 2)

Units first, as a subtraction is worked by hand: each digit then follows from the digits written before it (the same
digit of the line before and the borrow out of the digit just written), so a model learns the step several times
faster than with the most significant digit first, where the first digit written depends on a borrow out of digits not
yet written.

``a // b`` lines, one per subtraction; ``b`` is 2..9. With the character tokenizer a line is five tokens (four digits
and the space, the last line's space being the eos), so an answer of ``n`` lines is ``5 n`` tokens. ``n`` follows a
Pareto distribution (:data:`PARETO_ALPHA`) cut to :data:`MIN_LINES`..:data:`MAX_LINES` lines: answers of 65 to 2,045
tokens with a long tail: a median of about 125 tokens and a mean of about 230, with one answer in thirty past 1,000.

A completion is right when its lines are exactly the worked solution (:func:`is_right`): only then is its last line
the answer, reached by the work. Checking the work as well as the last line leaves no shortcut to the reward (for
``b`` of 2 or 5 the remainder could be read off the last digit of ``a``), so the answers stay as long as the work.
Its credit (:func:`credit`) is the share of the solution's lines it writes before its first slip: 1 only when it is
right, so a policy that slips once in a long answer still learns from the lines before the slip. The share is of the
completion's lines when it writes more than the solution has: a policy that does the work but does not stop after the
answer would otherwise earn nearly full credit for every line it rambles on, and learn to ramble.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

WIDTH = 4
"""Digits of every number: ``a`` in the prompt and each line of the answer."""
MIN_LINES, MAX_LINES = 13, 409
"""Fewest and most subtractions (answer lines) of a drawn problem: 65 to 2,045 answer tokens."""
PARETO_ALPHA = 1.0
"""Tail index of the line count: P(more than n lines) = (MIN_LINES / n) ** PARETO_ALPHA before the cut."""
_PROMPT = re.compile(rf"(\d{{{WIDTH}}})-([2-9])=")


@dataclass(frozen=True)
class WorkedProblem:
    """One problem: subtract ``b`` (2..9) from ``a`` until less than ``b`` remains."""

    a: int
    b: int

    def __post_init__(self) -> None:
        if not 2 <= self.b <= 9 or not self.b <= self.a < 10**WIDTH:
            raise ValueError(f"a worked problem needs 2 <= b <= 9 and b <= a < {10**WIDTH}, got a={self.a} b={self.b}")

    @property
    def prompt(self) -> str:
        """The prompt text, ``"0023-7="``."""
        return f"{self.a:0{WIDTH}d}-{self.b}="

    @property
    def lines(self) -> list[str]:
        """The worked solution's lines: ``a - b``, ``a - 2 b``, ... down to ``a mod b``, each :data:`WIDTH` digits
        written units first (:func:`units_first`)."""
        return [units_first(value) for value in range(self.a - self.b, -1, -self.b)]

    @property
    def solution(self) -> str:
        """The worked solution, its lines joined by single spaces."""
        return " ".join(self.lines)

    @property
    def answer(self) -> str:
        """The final answer, ``a mod b``, as a plain integer."""
        return str(self.a % self.b)


def units_first(value: int) -> str:
    """``value`` as a line of the worked solution: :data:`WIDTH` digits, zero-padded, the units digit first
    (16 -> ``"6100"``)."""
    return f"{value:0{WIDTH}d}"[::-1]


def parse_prompt(text: str) -> WorkedProblem:
    """The problem a prompt text (``"0023-7="``) poses; ValueError when the text is no such prompt."""
    match = _PROMPT.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is no worked-arithmetic prompt: it needs {WIDTH} digits, '-', a digit 2..9, '='")
    return WorkedProblem(int(match.group(1)), int(match.group(2)))


def draw_problems(count: int, seed: int | str) -> list[WorkedProblem]:
    """``count`` problems drawn from ``seed``: a line count from the cut Pareto tail, ``b`` uniform in 2..9, and a
    remainder uniform below ``b``."""
    rng = random.Random(f"worked_arithmetic:{seed}")
    problems = []
    while len(problems) < count:
        lines = int(MIN_LINES / (1.0 - rng.random()) ** (1.0 / PARETO_ALPHA))
        if lines > MAX_LINES:
            continue  # cut the tail: draw again
        b = rng.randint(2, 9)
        problems.append(WorkedProblem(lines * b + rng.randrange(b), b))
    return problems


def is_right(problem: WorkedProblem, completion: str) -> bool:
    """Whether ``completion``'s lines (split at whitespace) are exactly ``problem``'s worked solution."""
    return completion.split() == problem.lines


def credit(problem: WorkedProblem, completion: str) -> float:
    """The lines ``completion`` writes (split at whitespace) before its first slip, over the solution's ``n`` lines or
    the completion's, whichever are more: 1.0 only when it is exactly the solution. Lines written past the answer
    dilute the credit: a right solution followed by ``k`` more lines scores as one whose last line slipped, over
    ``n + k`` lines, ``(n - 1) / (n + k)``, so running on to ``max_new_tokens`` earns next to nothing."""
    if is_right(problem, completion):
        return 1.0
    lines, written, right = problem.lines, completion.split(), 0
    for want, got in zip(lines[:-1], written, strict=False):
        if want != got:
            break
        right += 1
    return right / max(len(lines), len(written))


def final_answer(completion: str) -> str | None:
    """The completion's last line (its last whitespace-separated piece) read back most significant digit first
    (``"2000"`` -> ``"0002"``), or None when the completion is empty."""
    pieces = completion.split()
    return pieces[-1][::-1] if pieces else None
