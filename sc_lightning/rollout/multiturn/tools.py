"""Tools the model can call: plain Python callables registered by name, run under a deadline, and two call formats.

A tool call is parsed from the text of one model turn (:func:`parse_turn`) into a :class:`ToolCall`, a
:class:`FinalAnswer` or a :class:`Malformed` turn. Formats:

- ``"tag"`` (for tokenizers with a real vocabulary): ``<tool name="NAME">ARGUMENT</tool>`` anywhere in the turn is a
  call; a turn without ``<tool`` is the final answer; a ``<tool`` that does not parse is malformed.
- ``"char"`` (for the built-in CharTokenizer, whose alphabet is ``"0123456789+-*= "``): a turn that is an integer
  expression with an operator (``12*34``) is a call of the ``calculator`` tool; a bare integer is the final answer;
  anything else is malformed.

A malformed call is the model's mistake, not an infrastructure failure: environments end the conversation with
reward 0 (see docs/multiturn.md). A tool that raises or overruns its timeout gives a :class:`ToolResult` with
``ok=False``, which the environment turns into an observation; it never crashes the rollout.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

ToolFormat = Literal["tag", "char"]
_TAG = re.compile(r'<tool name="(?P<name>[A-Za-z_][\w.-]*)">(?P<argument>.*?)</tool>', re.DOTALL)
_CHAR_CALL = re.compile(r"\s*(?P<argument>\d+\s*[-+*]\s*\d+(?:\s*[-+*]\s*\d+)*)\s*")
_CHAR_ANSWER = re.compile(r"\s*(?P<answer>-?\d+)\s*")


@dataclass(frozen=True)
class ToolCall:
    """The model asked to run tool ``name`` on ``argument`` (the text between the call's delimiters)."""

    name: str
    argument: str


@dataclass(frozen=True)
class FinalAnswer:
    """The model's turn is its final answer, ``text``, for the environment to score."""

    text: str


@dataclass(frozen=True)
class Malformed:
    """The model's turn is neither a well-formed call nor an answer; ``reason`` says what is wrong."""

    reason: str


@dataclass(frozen=True)
class ToolResult:
    """What running a tool gave: its output text (``ok``), or an error description (raised, timed out, unknown)."""

    ok: bool
    text: str


def parse_turn(text: str, tool_format: ToolFormat) -> ToolCall | FinalAnswer | Malformed:
    """One model turn's text read in ``tool_format`` (see the module doc)."""
    if tool_format == "tag":
        if "<tool" not in text:
            return FinalAnswer(text)
        match = _TAG.search(text)
        if match is None:
            return Malformed(f'a tool call must read <tool name="NAME">ARGUMENT</tool>, got {text!r}')
        return ToolCall(match["name"], match["argument"])
    if tool_format == "char":
        if (call := _CHAR_CALL.fullmatch(text)) is not None:
            return ToolCall("calculator", call["argument"])
        if (answer := _CHAR_ANSWER.fullmatch(text)) is not None:
            return FinalAnswer(answer["answer"])
        return Malformed(f"a turn must be an expression like 12*34 or an integer answer, got {text!r}")
    raise ValueError(f"unknown tool format {tool_format!r}; known: tag, char")


class ToolRegistry:
    """Tools by name, each a callable ``(argument: str) -> str`` run in a worker thread under ``timeout_s``."""

    def __init__(self, tools: dict[str, Callable[[str], str]], *, timeout_s: float = 5.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"a tool timeout must be positive, got {timeout_s}")
        self._tools = dict(tools)
        self.timeout_s = timeout_s

    @property
    def names(self) -> tuple[str, ...]:
        """The registered tool names, sorted."""
        return tuple(sorted(self._tools))

    def run(self, call: ToolCall) -> ToolResult:
        """Run ``call``: its output, or ``ok=False`` when the tool is unknown, raises, or overruns the timeout.

        A timed-out tool's thread is left to finish in the background (a daemon thread; Python cannot kill it).
        """
        tool = self._tools.get(call.name)
        if tool is None:
            return ToolResult(False, f"unknown tool {call.name!r}; known: {', '.join(self.names)}")
        outcome: list[ToolResult] = []
        done = threading.Event()

        def invoke() -> None:
            """Run the tool in the worker thread; record its output or its exception, then signal ``done``."""
            try:
                outcome.append(ToolResult(True, str(tool(call.argument))))
            except Exception as exc:  # a failing tool is an observation for the model, not a crash
                outcome.append(ToolResult(False, f"tool {call.name!r} raised {type(exc).__name__}: {exc}"))
            finally:
                done.set()

        threading.Thread(target=invoke, name=f"tool-{call.name}", daemon=True).start()
        if not done.wait(self.timeout_s):
            return ToolResult(False, f"tool {call.name!r} timed out after {self.timeout_s} s")
        return outcome[0]


def calculator(expression: str) -> str:
    """The integer value of ``expression``: integers joined by ``+``, ``-`` and ``*`` (usual precedence)."""
    if not re.fullmatch(r"\s*-?\d+(?:\s*[-+*]\s*-?\d+)*\s*", expression):
        raise ValueError(f"not an integer expression of + - *: {expression!r}")
    total = 0
    for term in re.findall(r"[-+]?[^-+]+", expression.replace(" ", "")):
        sign, body = (-1, term[1:]) if term.startswith("-") else (1, term.lstrip("+"))
        product = 1
        for factor in body.split("*"):
            product *= int(factor)
        total += sign * product
    return str(total)
