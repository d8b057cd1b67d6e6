"""Math answers checked with math-verify: the completion's final (boxed) answer against the prompt's answer."""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from sc_lightning.rollout.envs.base import RewardError
from sc_lightning.types import Prompt

_BOXED = ("\\boxed{", "\\fbox{")


def last_boxed_content(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if none."""
    start = max(text.rfind(marker) for marker in _BOXED)
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None  # unbalanced: the completion was cut off inside the box


def _drop_timeout_disabled_warning(record: logging.LogRecord) -> bool:
    """Logging filter: math-verify warns once that its timeout is off; here the rollout manager's deadline applies."""
    return not str(record.msg).startswith("Timeout is disabled")


def _quiet_math_verify_timeout_warning() -> None:
    """Install the filter on math-verify's parser and grader loggers (idempotent)."""
    for name in ("math_verify.parser", "math_verify.grader"):
        log = logging.getLogger(name)
        if _drop_timeout_disabled_warning not in log.filters:
            log.addFilter(_drop_timeout_disabled_warning)


def _in_main_thread() -> bool:
    """Whether signals (math-verify's timeout mechanism) can be used from the calling thread."""
    return threading.current_thread() is threading.main_thread()


class MathEnvironment:
    """Reward 1.0 when math-verify finds the completion's answer equal to ``prompt.answer``, else 0.0.

    The completion's answer is the contents of its last ``\\boxed{...}`` when it has one (falling back to the whole
    text when that box does not parse), else whatever math-verify extracts from the whole text. The prompt's answer
    may be plain (``0.5``) or LaTeX (``\\frac{1}{2}``). Model output never raises: anything unparseable scores 0.0.
    A prompt whose answer is missing or cannot be parsed raises RewardError.

    math-verify bounds its own work with ``signal.alarm``, which only works in the main thread; in any other thread
    (where the rollout manager runs environments under its own deadline) its timeouts are turned off.
    """

    name: str = "math"

    def __init__(self, timeout_s: int = 5) -> None:
        import math_verify  # lazy: pulls in sympy
        from math_verify.errors import TimeoutException

        _quiet_math_verify_timeout_warning()
        self._mv = math_verify
        self._timeout_exc: type[BaseException] = TimeoutException
        self.timeout_s = int(timeout_s)
        self._gold = functools.lru_cache(maxsize=4096)(self._parse_gold)

    def _timeout(self) -> int | None:
        return self.timeout_s if self.timeout_s > 0 and _in_main_thread() else None

    def _parse(self, text: str) -> list[Any]:
        try:
            return list(self._mv.parse(text, parsing_timeout=self._timeout()))
        except (Exception, self._timeout_exc):  # math-verify times out with a BaseException
            return []

    def _parse_gold(self, answer: str) -> tuple[Any, ...]:
        text = answer.strip()
        parsed = self._parse(text if "$" in text or "\\boxed" in text else f"${text}$")
        if not parsed:
            parsed = self._parse(text)
        return tuple(parsed)

    def gold(self, prompt: Prompt) -> list[Any]:
        """The parsed answer of ``prompt``; RewardError when it has none or math-verify cannot parse it."""
        try:
            return self._checked_gold(prompt.answer)
        except RewardError as err:
            raise RewardError(f"prompt {prompt.prompt_id}: {err}") from None

    def check_answer(self, answer: str | None) -> None:
        """RewardError when ``answer`` is missing or math-verify cannot parse it (checked as the dataset loads)."""
        self._checked_gold(answer)

    def _checked_gold(self, answer: str | None) -> list[Any]:
        if answer is None or not str(answer).strip():
            raise RewardError(f"the math environment needs an answer, got {answer!r}")
        parsed = self._gold(str(answer))
        if not parsed:
            raise RewardError(f"math-verify cannot parse the answer {answer!r}")
        return list(parsed)

    def extract(self, completion_text: str) -> list[Any]:
        """The parsed final answer of a completion (empty when nothing parses); never raises."""
        try:
            boxed = last_boxed_content(completion_text)
            if boxed is not None and boxed.strip():
                parsed = self._parse(f"${boxed}$")
                if parsed:
                    return parsed
            return self._parse(completion_text)
        except Exception:
            return []

    def extract_answer(self, completion_text: str) -> str | None:
        """The completion's final answer as text: its last box's contents, else the text math-verify extracted from
        the whole completion; None when nothing parses."""
        boxed = last_boxed_content(completion_text)
        if boxed is not None and boxed.strip():
            return boxed.strip()
        parsed = self.extract(completion_text)
        return str(parsed[-1]) if parsed else None

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """1.0 when the completion's answer is mathematically equal to the prompt's, else 0.0."""
        gold = self.gold(prompt)
        predicted = self.extract(completion_text)
        if not predicted:
            return 0.0
        try:
            ok = self._mv.verify(gold, predicted, timeout_seconds=self._timeout())
        except (Exception, self._timeout_exc):  # math-verify times out with a BaseException
            return 0.0
        return 1.0 if ok else 0.0

    def __repr__(self) -> str:
        return f"MathEnvironment(timeout_s={self.timeout_s})"
