"""A refit between two turns of a conversation on the real Megatron engine: the row carries both versions, each
token the logprob of the weights that sampled it, and importance sampling weighs each token by its own version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.controller.api import GroupMeta
from sc_lightning.controller.rows import group_to_columns
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.engines.sampling import scoring_temperature
from sc_lightning.models import export_hf_weights, load_policy, token_logprobs
from sc_lightning.rollout.envs.base import Score
from sc_lightning.rollout.multiturn import TurnLimits, calculator_prompts, chat_template_for, run_conversation
from sc_lightning.rollout.multiturn.protocol import Observation
from sc_lightning.rollout.multiturn.source import conversation_generation
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.trainer.chunks import load_chunk
from sc_lightning.types import Generation, Prompt, SamplingParams, ScoredGroup

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]
TOK = CharTokenizer()
SAMPLING = SamplingParams(max_new_tokens=6, temperature=1.0, seed=11)
PROMPT = calculator_prompts(1, seed=0)[0]


class ObserveThenReward:
    """A custom multi-turn environment: the first model turn gets the observation ``408``, the second reward 1."""

    name = "observe-then-reward"

    def start(self, prompt: Prompt) -> ObserveThenReward:
        """A fresh episode (this object keeps its own turn count)."""
        episode = ObserveThenReward()
        episode.turns = 0
        return episode

    def step(self, model_text: str) -> Observation | Score:
        """An observation after turn 1, the reward after turn 2."""
        self.turns += 1
        return Observation("408") if self.turns == 1 else Score(1.0)


def play_with_a_refit(dirs: dict[str, Path]) -> Generation:
    """One conversation on an engine serving ``a`` (version 0) for turn 1 and ``b`` (version 1) for turn 2."""
    model_b, spec_b, _ = load_policy(str(dirs["b"]))

    async def scenario() -> Generation:
        engine = MegatronEngine.from_pretrained(str(dirs["a"]))
        try:

            async def generate(token_ids: tuple[int, ...], budget: int, turn: int) -> Generation:
                """Turn 2 runs after a refit to the other weights."""
                if turn == 2:
                    await engine.update_weights(export_hf_weights(model_b, spec_b), version=1)
                params = SamplingParams(min(SAMPLING.max_new_tokens, budget), temperature=1.0, seed=SAMPLING.seed)
                return await engine.generate(token_ids, params)

            outcome = await run_conversation(
                PROMPT, ObserveThenReward(), chat_template_for(TOK), TOK, generate, TurnLimits(max_turns=2)
            )
        finally:
            await engine.shutdown()
        assert outcome.ended_by == "reward" and outcome.score.reward == 1.0
        return conversation_generation(outcome, 0)

    return asyncio.run(scenario())


def test_a_refit_between_turns_keeps_each_tokens_version_and_logprob(tiny_dirs: dict[str, Path]) -> None:
    generation = play_with_a_refit(tiny_dirs)
    flags = torch.tensor(generation.trainable)
    versions = torch.tensor(generation.token_versions)
    turn_starts = [t for t in range(len(flags)) if flags[t] and (t == 0 or not flags[t - 1])]
    assert len(turn_starts) == 2 and not flags.all()  # two model turns around environment tokens
    second = turn_starts[1]
    assert set(versions[:second][flags[:second]].tolist()) == {0}
    assert set(versions[second:][flags[second:]].tolist()) == {1}
    assert generation.weight_version == 0  # the conversation's first model token

    # the row, through the controller's columns and the data plane, as the trainer reads it
    plane = MemoryDataPlane()
    group = ScoredGroup(PROMPT, (generation,), (1.0,))
    keys, columns, tags = group_to_columns("g0", group, start_weight=0, end_weight=1)
    plane.put(keys, columns, tags)
    length = len(PROMPT.token_ids) + len(generation.token_ids)
    meta = GroupMeta("g0", PROMPT.prompt_id, tuple(keys), (length,), 0, 1, None)
    chunk = load_chunk(
        plane, [meta], pad_token_id=0, overlong_filtering=False, leave_one_out=False, normalize_rewards=False
    )
    start = len(PROMPT.token_ids)
    row_versions = chunk.token_versions[0, start:]
    assert torch.equal(row_versions, versions) and torch.equal(chunk.token_mask[0, start:].bool(), flags)

    # each model token's logprob is that of the weights that sampled it
    temperature = scoring_temperature(SAMPLING.temperature)
    with torch.no_grad():
        by_a = token_logprobs(load_policy(str(tiny_dirs["a"]))[0].eval(), chunk.input_ids, temperature=temperature)
        by_b = token_logprobs(load_policy(str(tiny_dirs["b"]))[0].eval(), chunk.input_ids, temperature=temperature)
    stored = chunk.generation_logprobs[0, start:]
    expected = torch.where(versions == 0, by_a[0, start:], by_b[0, start:])
    torch.testing.assert_close(stored[flags], expected[flags], atol=1e-4, rtol=0)
    assert not torch.allclose(by_a[0, start:][flags], by_b[0, start:][flags], atol=1e-2)  # the refit mattered

    # a trainer at version 1 weighs turn 1's tokens by pi_b / pi_a and turn 2's by 1: its own samples
    loss_fn = ClippedPGLoss(token_level_loss=True, reference_policy_kl_penalty=0.0)
    _, metrics = loss_fn(
        by_b,
        prev_logprobs=by_b,
        generation_logprobs=chunk.generation_logprobs,
        advantages=torch.ones_like(by_b) * chunk.token_mask,
        mask=chunk.token_mask,
        num_valid_tokens=1.0,
        num_valid_seqs=1.0,
    )
    weights = torch.exp(by_b[0, start:] - stored)[flags]
    assert torch.allclose(weights[versions[flags] == 1], torch.ones(1), atol=1e-3)
    assert float(metrics["sampling_importance_ratio"]) == pytest.approx(float(weights.sum()), rel=1e-4)
