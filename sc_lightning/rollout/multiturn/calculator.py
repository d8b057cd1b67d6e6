"""The calculator task: two-digit products the tiny model cannot compute in one step, but can with a calculator.

A prompt is ``"a*b"`` (10 <= a, b <= 99) with answer ``str(a * b)``. The intended conversation (built-in char
format, see :mod:`sc_lightning.rollout.multiturn.tools`): the model calls the calculator by repeating the expression,
the environment answers with the result, the model gives that number as its final answer. Reward 1.0 for the right
final answer, 0.0 for a wrong one or a malformed turn (which ends the conversation). A tool error (the calculator
raising or timing out) is shown to the model as an observation: its message in the ``tag`` format, an empty result
in the ``char`` format (whose alphabet cannot spell a message).
"""

from __future__ import annotations

import random

from sc_lightning.rollout.envs.arithmetic import expected_integer, integer_answer, leading_integer
from sc_lightning.rollout.envs.base import Score
from sc_lightning.rollout.multiturn.chat import chat_template_for, user_prompt_ids
from sc_lightning.rollout.multiturn.protocol import Observation, register_multiturn_environment
from sc_lightning.rollout.multiturn.tools import (
    FinalAnswer,
    Malformed,
    ToolFormat,
    ToolRegistry,
    calculator,
    parse_turn,
)
from sc_lightning.tokenizer import CharTokenizer, Tokenizer
from sc_lightning.types import Prompt


class CalculatorEpisode:
    """One calculator conversation: tool calls run the calculator; the final answer is scored against the prompt's."""

    def __init__(self, prompt: Prompt, tools: ToolRegistry, tool_format: ToolFormat) -> None:
        self._expected = expected_integer(prompt)
        self._tools = tools
        self._format = tool_format

    def step(self, model_text: str) -> Observation | Score:
        """The calculator's result for a call, or the final reward (1.0 right answer, 0.0 wrong or malformed)."""
        turn = parse_turn(model_text, self._format)
        if isinstance(turn, Malformed):
            return Score(0.0)
        if isinstance(turn, FinalAnswer):
            return Score(1.0 if leading_integer(turn.text) == self._expected else 0.0)
        result = self._tools.run(turn)
        if result.ok:
            return Observation(result.text)
        return Observation(f"error: {result.text}" if self._format == "tag" else "")


class CalculatorEnvironment:
    """The multi-turn calculator environment (``env.name: calculator``); see the module doc."""

    name: str = "calculator"

    def __init__(self, tool_format: ToolFormat = "char", timeout_s: float = 5.0) -> None:
        self._tools = ToolRegistry({"calculator": calculator}, timeout_s=timeout_s)
        self._format: ToolFormat = tool_format

    def check_answer(self, answer: str | None) -> None:
        """RewardError when ``answer`` is not an integer (checked as the dataset loads)."""
        integer_answer(answer)

    def start(self, prompt: Prompt) -> CalculatorEpisode:
        """A fresh episode for ``prompt`` (RewardError when it has no integer answer)."""
        return CalculatorEpisode(prompt, self._tools, self._format)

    def __repr__(self) -> str:
        return f"CalculatorEnvironment(tool_format={self._format!r})"


def calculator_prompts(count: int, seed: int, tokenizer: Tokenizer | None = None) -> list[Prompt]:
    """``count`` prompts ``"a*b"`` of two-digit factors, ids ``calculator-{i:06d}``, rendered as a user message by
    the tokenizer's chat template (the built-in CharTokenizer's by default)."""
    rng = random.Random(f"calculator:{seed}")
    template = chat_template_for(tokenizer or CharTokenizer())
    prompts = []
    for i in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        text = f"{a}*{b}"
        ids = user_prompt_ids(template, text)
        prompts.append(Prompt(f"calculator-{i:06d}", ids, text, str(a * b), "calculator", index=i))
    return prompts


register_multiturn_environment("calculator", CalculatorEnvironment)
