"""A SampleSource replaces the one-completion sample: its rollouts keep their own scores and their trainable mask.

The source here is a FAKE two-turn conversation (model tokens, a tool's answer, model tokens) built from the real
engine's completion, so the path from a sample source through the controller to committed rows is real.
"""

from __future__ import annotations

import asyncio

from sc_lightning.controller.api import ROW_FIELDS
from sc_lightning.rollout.envs.base import Score
from sc_lightning.rollout.manager import Sample
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.types import Generation, Prompt, SamplingParams
from tests.helpers.controllers import config, make
from tests.helpers.scripts import TOKENIZER, answer_correctly

TOOL_TOKENS = tuple(TOKENIZER.encode("77="))


class FakeTwoTurnSource:
    """FAKE conversation: the engine answers, a tool replies with ``77=``, the engine answers again; reward 0.25."""

    def __init__(self, engine: ScriptedEngine) -> None:
        self.engine = engine

    async def sample(self, prompt: Prompt, group_id: str, seed: int) -> Sample:
        first = await self.engine.generate(prompt.token_ids, self.sampling)
        second = await self.engine.generate(prompt.token_ids, self.sampling)  # the script answers the prompt again
        tokens = first.token_ids + TOOL_TOKENS + second.token_ids
        trainable = (True,) * len(first.token_ids) + (False,) * len(TOOL_TOKENS) + (True,) * len(second.token_ids)
        logprobs = first.logprobs + (0.0,) * len(TOOL_TOKENS) + second.logprobs
        return Sample(Generation(tokens, logprobs, "stop", first.weight_version, (), trainable), Score(0.25))

    sampling = SamplingParams(max_new_tokens=3)


class RefusingEnvironment:
    """An environment that must not be asked: the source scored its samples."""

    name = "refusing"

    def score(self, prompt: Prompt, completion_text: str) -> float:
        raise AssertionError("a sample that scored itself was scored again")


def test_a_sample_source_commits_its_own_scores_and_masks_the_tool_tokens() -> None:
    async def scenario():
        engine = ScriptedEngine(answer_correctly)
        controller = make(config({"name": "in_order", "max_lookahead_versions": 0}), engine)
        controller.manager.sample_source = FakeTwoTurnSource(engine)
        controller.manager.environment = RefusingEnvironment()
        await controller.start()
        groups = await controller.select(0, 2, 2, timeout_s=30)
        rows = controller.buffer.data_plane.get([key for g in groups for key in g.keys], list(ROW_FIELDS))
        stats = controller.stats()
        await controller.shutdown()
        return rows, stats

    rows, stats = asyncio.run(scenario())
    assert [reward.item() for reward in rows["total_reward"]] == [0.25] * 4
    for input_ids, mask, prompt_length in zip(
        rows["input_ids"], rows["token_mask"], rows["prompt_lengths"], strict=True
    ):
        completion = input_ids[int(prompt_length) :].tolist()
        tool_at = [i for i in range(len(completion)) if tuple(completion[i : i + 3]) == TOOL_TOKENS][0]
        flags = mask[int(prompt_length) :].tolist()
        assert flags[tool_at : tool_at + 3] == [0, 0, 0]  # the tool's tokens are never trained
        assert sum(flags) == len(completion) - 3  # every model token is
    model_tokens = sum(int(mask.sum()) for mask in rows["token_mask"])
    assert stats.engine_time.trained_tokens == model_tokens  # goodput counts the model's tokens, not the tool's
