"""The multi-turn sample source plays whole calculator conversations through the rollout manager.

The engine is the FAKE ScriptedEngine (a scripted calculator user: call the tool, then answer); the manager, the
driver, the environment, the chat template, the tools and (last test) the controller build and rows are real.
"""

from __future__ import annotations

import asyncio

import pytest

from sc_lightning.config import load_config
from sc_lightning.controller.api import ROW_FIELDS
from sc_lightning.controller.build import build_controller
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.datasets import build_dataset
from sc_lightning.rollout.envs import build_environment
from sc_lightning.rollout.manager import RolloutManager, RolloutSettings, RolloutTimeout, ServedPolicy
from sc_lightning.rollout.multiturn import CalculatorEnvironment, MultiTurnSource, TurnLimits, calculator_prompts
from sc_lightning.rollout.multiturn.chat import chat_template_for
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import SamplingParams
from tests.helpers.scripts import calculator_user

TOK = CharTokenizer()
PROMPT = calculator_prompts(1, seed=3)[0]


class RefusingEnvironment:
    """A single-turn environment that must not be asked: the conversations scored themselves."""

    name = "refusing"

    def score(self, prompt: object, completion_text: str) -> float:
        raise AssertionError("a conversation was scored again")


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


def test_env_name_calculator_wires_conversations_into_committed_rows() -> None:
    cfg = load_config(
        {
            "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_epochs": 1, "seed": 3},
            "policy": {"train_global_batch_size": 4, "generation": {"max_new_tokens": 8}},
            "env": {"name": "calculator", "max_turns": 3, "max_conversation_tokens": 48},
            "data": {"dataset_name": "calculator"},
            "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 0}},
            "data_plane": {"backend": "memory"},
        }
    )
    engine = ScriptedEngine(calculator_user)

    async def scenario():  # noqa: ANN202
        controller = build_controller(
            cfg,
            data_plane=MemoryDataPlane(),
            engine=engine,
            environment=build_environment(cfg.env),
            tokenizer=TOK,
            dataset=build_dataset(cfg.data, TOK, seed=3),
        )
        assert isinstance(controller.manager.sample_source, MultiTurnSource)
        assert controller.manager.sample_source.limits == TurnLimits(3, 48)
        await controller.start()
        groups = await controller.select(0, 2, 2, timeout_s=30)
        rows = controller.buffer.data_plane.get([key for g in groups for key in g.keys], list(ROW_FIELDS))
        await controller.shutdown()
        return rows

    rows = asyncio.run(scenario())
    assert [reward.item() for reward in rows["total_reward"]] == [1.0] * 4
    for input_ids, mask, prompt_length in zip(
        rows["input_ids"], rows["token_mask"], rows["prompt_lengths"], strict=True
    ):
        ids, flags = input_ids.tolist(), mask.tolist()
        start = int(prompt_length)
        first_eos = ids.index(TOK.EOS, start)
        answer_from = first_eos + 1
        observation_end = ids.index(TOK.encode("=")[0], answer_from) + 1
        assert all(flags[start : first_eos + 1])  # the tool call is trained
        assert not any(flags[answer_from:observation_end])  # the calculator's answer never is
        assert all(flags[observation_end : ids.index(TOK.EOS, observation_end) + 1])  # the final answer is
