"""Tool calls parse in both formats; a tool that raises, overruns or is unknown is an error result, not a crash."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.rollout.multiturn.tools import (
    FinalAnswer,
    Malformed,
    ToolCall,
    ToolRegistry,
    calculator,
    parse_turn,
)


def test_tag_format() -> None:
    assert parse_turn('ok <tool name="calculator">12*34</tool>', "tag") == ToolCall("calculator", "12*34")
    assert parse_turn("408", "tag") == FinalAnswer("408")
    assert isinstance(parse_turn('<tool name="calculator">12*34', "tag"), Malformed)


def test_char_format() -> None:
    assert parse_turn("12*34", "char") == ToolCall("calculator", "12*34")
    assert parse_turn(" 408 ", "char") == FinalAnswer("408")
    assert isinstance(parse_turn("12*", "char"), Malformed)
    assert isinstance(parse_turn("", "char"), Malformed)


@given(st.lists(st.integers(-99, 99), min_size=1, max_size=4), st.lists(st.sampled_from("+-*"), max_size=3))
def test_calculator_matches_python(numbers: list[int], ops: list[str]) -> None:
    expression = str(numbers[0]) + "".join(op + str(abs(n)) for op, n in zip(ops, numbers[1:], strict=False))
    assert calculator(expression) == str(eval(expression))  # noqa: S307 - digits and + - * only


def test_raising_and_unknown_tools_are_error_results() -> None:
    registry = ToolRegistry({"calculator": calculator})
    result = registry.run(ToolCall("calculator", "12/0"))
    assert not result.ok and "ValueError" in result.text
    unknown = registry.run(ToolCall("search", "x"))
    assert not unknown.ok and "unknown tool" in unknown.text
    assert registry.run(ToolCall("calculator", "12*34")).text == "408"


def test_a_tool_past_its_timeout_is_an_error_result() -> None:
    release = threading.Event()
    registry = ToolRegistry({"stuck": lambda _: str(release.wait())}, timeout_s=0.05)
    try:
        result = registry.run(ToolCall("stuck", ""))
    finally:
        release.set()
    assert not result.ok and "timed out" in result.text


def test_a_non_positive_timeout_is_rejected() -> None:
    with pytest.raises(ValueError, match="timeout"):
        ToolRegistry({}, timeout_s=0)
