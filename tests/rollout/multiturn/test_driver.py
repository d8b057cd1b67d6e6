"""A calculator conversation ends in a reward, a scored malformed turn, or a limit; tool errors are observations."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pytest

from sc_lightning.config.runtime import EnvConfig
from sc_lightning.rollout.envs.base import RewardError, Score
from sc_lightning.rollout.multiturn import (
    CalculatorEnvironment,
    TurnLimits,
    build_multiturn_environment,
    calculator_prompts,
    chat_template_for,
    run_conversation,
)
from sc_lightning.rollout.multiturn.calculator import CalculatorEpisode
from sc_lightning.rollout.multiturn.chat import ChatTemplateError
from sc_lightning.rollout.multiturn.protocol import Observation
from sc_lightning.rollout.multiturn.tools import ToolRegistry
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import Generation

TOK = CharTokenizer()
PROMPT = calculator_prompts(1, seed=0)[0]


class FakeScriptedModel:
    """A fake policy that answers each turn with the next scripted text (plus eos), at version = turn index."""

    def __init__(self, turns: Sequence[str]) -> None:
        self.turns = list(turns)
        self.seen: list[tuple[int, ...]] = []

    async def __call__(self, token_ids: tuple[int, ...], max_new_tokens: int, turn: int) -> Generation:
        self.seen.append(token_ids)
        ids = (*TOK.encode(self.turns[len(self.seen) - 1]), TOK.EOS)[:max_new_tokens]
        return Generation(ids, tuple(-0.1 for _ in ids), "stop", len(self.seen))


DEFAULT_LIMITS = TurnLimits()


def _run(turns: Sequence[str], limits: TurnLimits = DEFAULT_LIMITS):  # noqa: ANN202
    model = FakeScriptedModel(turns)
    run = run_conversation(PROMPT, CalculatorEnvironment(), chat_template_for(TOK), TOK, model, limits)
    return model, asyncio.run(run)


def test_calculator_call_then_answer_is_rewarded_and_recorded() -> None:
    product = PROMPT.answer
    model, outcome = _run([PROMPT.text, product])
    assert outcome.score == Score(1.0) and outcome.ended_by == "reward"
    conv = outcome.conversation
    expected = [TOK.BOS, *TOK.encode(f"{PROMPT.text}={PROMPT.text}"), TOK.EOS, *TOK.encode(f"{product}={product}")]
    assert list(conv.token_ids) == [*expected, TOK.EOS]
    assert [s.role for s in conv.turns] == ["prompt", "model", "env", "model"]
    assert sum(conv.trainable) == len(PROMPT.text) + len(product) + 2
    assert model.seen[1] == conv.token_ids[: conv.turns[2].end]  # turn 2 saw the tool result
    assert set(conv.token_versions[conv.turns[3].start :]) == {2}  # a refit between turns is recorded


def test_wrong_answer_and_malformed_turn_score_zero() -> None:
    assert _run(["1"])[1].score == Score(0.0)
    _, malformed = _run(["12**"])
    assert malformed.score == Score(0.0) and malformed.conversation.model_turns == 1


def test_limits_end_the_conversation_with_zero() -> None:
    _, looping = _run([PROMPT.text] * 5, TurnLimits(max_turns=2))
    assert (looping.ended_by, looping.score.reward, looping.conversation.model_turns) == ("max_turns", 0.0, 2)
    _, long = _run([PROMPT.text, PROMPT.answer], TurnLimits(max_tokens=len(PROMPT.token_ids) + 8))
    assert long.ended_by == "token_budget" and long.score.reward == 0.0
    assert len(long.conversation.token_ids) <= len(PROMPT.token_ids) + 8


def test_a_prompt_not_rendered_by_the_template_is_refused() -> None:
    raw = dataclasses.replace(PROMPT, token_ids=tuple(TOK.encode(PROMPT.text)))
    run = run_conversation(
        raw, CalculatorEnvironment(), chat_template_for(TOK), TOK, FakeScriptedModel(["1"]), DEFAULT_LIMITS
    )
    with pytest.raises(ChatTemplateError, match=f"prompt {PROMPT.prompt_id}.*rendered"):
        asyncio.run(run)


def test_a_tool_error_is_an_observation() -> None:
    def broken(_: str) -> str:
        raise RuntimeError("calculator offline")

    tag = CalculatorEpisode(PROMPT, ToolRegistry({"calculator": broken}), "tag")
    observation = tag.step('<tool name="calculator">12*34</tool>')
    assert isinstance(observation, Observation) and "calculator offline" in observation.text
    char = CalculatorEpisode(PROMPT, ToolRegistry({"calculator": broken}), "char")
    assert char.step("12*34") == Observation("")


def test_build_by_name_and_custom_class() -> None:
    assert isinstance(build_multiturn_environment("calculator"), CalculatorEnvironment)
    custom = build_multiturn_environment("sc_lightning.rollout.multiturn.calculator:CalculatorEnvironment")
    assert isinstance(custom, CalculatorEnvironment)
    with pytest.raises(RewardError, match="env.name"):
        build_multiturn_environment("nope")
    with pytest.raises(RewardError, match="not a multi-turn environment"):
        build_multiturn_environment("sc_lightning.tokenizer:CharTokenizer")


def test_turn_limits_from_config() -> None:
    assert TurnLimits.from_env_config(EnvConfig(max_turns=3, max_conversation_tokens=64)) == TurnLimits(3, 64)
    assert TurnLimits.from_env_config(EnvConfig(name="calculator")) == TurnLimits()
    with pytest.raises(ValueError, match="positive"):
        TurnLimits(max_turns=0)
