"""The multi-turn sample source plays whole calculator conversations through the rollout manager.

The engine is the FAKE ScriptedEngine (a scripted calculator user: call the tool, then answer); the manager, the
driver, the environment, the chat template and the tools are real.
"""

from __future__ import annotations

import asyncio

import pytest

from sc_lightning.rollout.manager import RolloutManager, RolloutSettings, RolloutTimeout, ServedPolicy
from sc_lightning.rollout.multiturn import CalculatorEnvironment, MultiTurnSource, TurnLimits, calculator_prompts
from sc_lightning.rollout.multiturn.chat import chat_template_for
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import SamplingParams

TOK = CharTokenizer()
PROMPT = calculator_prompts(1, seed=3)[0]


class RefusingEnvironment:
    """A single-turn environment that must not be asked: the conversations scored themselves."""

    name = "refusing"

    def score(self, prompt: object, completion_text: str) -> float:
        raise AssertionError("a conversation was scored again")


def calculator_user(prompt: tuple[int, ...], call: int) -> tuple[int, ...]:
    """Script: repeat the expression as a calculator call, then answer with the tool's result."""
    if TOK.EOS not in prompt:  # the opening: call the calculator with the expression
        return (*prompt[1:-1], TOK.EOS)
    after_call = prompt[len(prompt) - prompt[::-1].index(TOK.EOS) :]  # the tool's answer and its "="
    return (*after_call[:-1], TOK.EOS)


def manager_with(engine: ScriptedEngine, generation_timeout_s: float | None = 30.0, n: int = 1) -> RolloutManager:
    settings = RolloutSettings(n, SamplingParams(max_new_tokens=16), generation_timeout_s, 30.0)
    manager = RolloutManager(ServedPolicy(engine), RefusingEnvironment(), TOK, sink=None, settings=settings)  # type: ignore[arg-type]
    manager.sample_source = MultiTurnSource(manager, CalculatorEnvironment(), chat_template_for(TOK), TurnLimits())
    return manager


def test_a_group_of_conversations_is_scored_by_its_episodes() -> None:
    group = asyncio.run(manager_with(ScriptedEngine(calculator_user), n=3).run_rollout(PROMPT, "g0"))
    assert group.rewards == (1.0, 1.0, 1.0)  # the refusing single-turn environment was never asked


def test_a_conversation_keeps_the_model_tokens_their_logprobs_and_versions() -> None:
    engine = ScriptedEngine(calculator_user)

    async def scenario():  # noqa: ANN202
        manager = manager_with(engine)
        original = engine.generate

        async def bump_after_first_turn(ids, sampling):  # noqa: ANN001, ANN202
            generation = await original(ids, sampling)
            if len(ids) == len(PROMPT.token_ids):  # a refit lands between the turns
                await engine.update_weights([], 1)
            return generation

        engine.generate = bump_after_first_turn
        return await manager.run_rollout(PROMPT, "g0")

    group = asyncio.run(scenario())
    assert group.rewards == (1.0,)
    expression, product = PROMPT.text, PROMPT.answer
    for generation in group.generations:
        assert TOK.decode(generation.token_ids) == f"{expression}{product}={product}"
        n1, env = len(expression) + 1, len(product) + 1
        assert generation.trainable == (True,) * n1 + (False,) * env + (True,) * (len(product) + 1)
        assert generation.logprobs == (-0.5,) * n1 + (0.0,) * env + (-0.5,) * (len(product) + 1)
        assert generation.weight_version == 0
        assert generation.token_versions == (0,) * (n1 + env) + (1,) * (len(product) + 1)
        assert generation.model_token_count == n1 + len(product) + 1


def test_a_stuck_turn_is_a_rollout_timeout_naming_the_turn() -> None:
    engine = ScriptedEngine(calculator_user, gated=True)
    with pytest.raises(RolloutTimeout, match=rf"prompt {PROMPT.prompt_id} \(group g0, engine .*\): turn 1"):
        asyncio.run(manager_with(engine, generation_timeout_s=0.05).run_rollout(PROMPT, "g0"))
