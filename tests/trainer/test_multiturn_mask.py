"""Environment tokens of a conversation never reach the update: perturb them and the step is bit-identical.

Calculator conversations are played by the real driver (a scripted FAKE model stands in for the engine: the
engine's own multi-turn path is tests/engines/test_multiturn_refit.py), turned into rows by the controller's
group_to_columns, stored in the in-process data plane, read back by load_chunk and trained by PolicyUpdate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random

import torch

from sc_lightning.controller.api import GroupMeta
from sc_lightning.controller.rows import group_to_columns
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.multiturn import (
    CalculatorEnvironment,
    TurnLimits,
    calculator_prompts,
    chat_template_for,
    run_conversation,
)
from sc_lightning.rollout.multiturn.source import conversation_generation
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.trainer.chunks import load_chunk
from sc_lightning.types import Generation, Prompt, ScoredGroup
from tests.helpers.train_rows import fresh, run_step

TOK = CharTokenizer()
TRAINER_VERSION = 5


class FakeTurnModel:
    """A FAKE policy: turn 1 calls the calculator with the prompt's expression, turn 2 answers ``answer``; random
    logprobs; the first turn sampled at version 4 and the second at 5 (a refit between the turns)."""

    def __init__(self, prompt: Prompt, answer: str, seed: int) -> None:
        self.texts = [prompt.text, answer]
        self.rng = random.Random(seed)

    async def __call__(self, token_ids: tuple[int, ...], max_new_tokens: int, turn: int) -> Generation:
        ids = (*TOK.encode(self.texts[turn - 1]), TOK.EOS)[:max_new_tokens]
        logprobs = tuple(-self.rng.uniform(0.05, 2.0) for _ in ids)
        return Generation(ids, logprobs, "stop", TRAINER_VERSION - 2 + turn)


def conversation_groups() -> list[ScoredGroup]:
    """Two groups of four conversations each; some answers right (reward 1), some wrong (0)."""
    environment, template = CalculatorEnvironment(), chat_template_for(TOK)
    groups = []
    for prompt in calculator_prompts(2, seed=3):
        generations, rewards = [], []
        for i, answer in enumerate((prompt.answer, "1", prompt.answer, "77")):
            model = FakeTurnModel(prompt, answer, seed=i)
            outcome = asyncio.run(
                run_conversation(prompt, environment, template, TOK, model, TurnLimits(max_turns=3, max_tokens=48))
            )
            assert outcome.ended_by == "reward"
            generations.append(conversation_generation(outcome, TRAINER_VERSION))
            rewards.append(outcome.score.reward)
        assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]
        groups.append(ScoredGroup(prompt, tuple(generations), tuple(rewards)))
    return groups


def perturbed(group: ScoredGroup, target: str) -> ScoredGroup:
    """``group`` with garbage on its environment tokens (``target="environment"``: far-off logprobs, versions far
    outside the staleness window), or, as a control, on the first model token of each row: its logprob moved
    (``"model_logprob"``) or its version made stale (``"model_version"``)."""
    generations = []
    for generation in group.generations:
        logprobs, versions = list(generation.logprobs), list(generation.token_versions)
        for t, trainable in enumerate(generation.trainable):
            if target == "environment" and not trainable:
                logprobs[t], versions[t] = -7.5, 0  # 5 versions old: far above max_token_staleness
        first_model_token = generation.trainable.index(True)
        if target == "model_logprob":
            logprobs[first_model_token] -= 0.7
        elif target == "model_version":
            versions[first_model_token] = 0  # out of the window: masked out of the policy loss
        generations.append(dataclasses.replace(generation, logprobs=tuple(logprobs), token_versions=tuple(versions)))
    return dataclasses.replace(group, generations=tuple(generations))


def train(groups: list[ScoredGroup]) -> tuple[torch.nn.Module, dict[str, float], torch.Tensor]:
    """One policy step over ``groups`` through the data plane: the model after it, its metrics, the chunk's mask."""
    plane, metas = MemoryDataPlane(), []
    for index, group in enumerate(groups):
        keys, columns, tags = group_to_columns(f"g{index}", group, start_weight=4, end_weight=5)
        plane.put(keys, columns, tags)
        lengths = tuple(len(group.prompt.token_ids) + len(g.token_ids) for g in group.generations)
        metas.append(GroupMeta(f"g{index}", group.prompt.prompt_id, tuple(keys), lengths, 4, 5, None))
    chunk = load_chunk(
        plane,
        metas,
        pad_token_id=TOK.pad_token_id,
        overlong_filtering=False,
        leave_one_out=False,
        normalize_rewards=True,
    )
    model = fresh()
    metrics = run_step(model, [chunk], micro_batch_size=3, version=TRAINER_VERSION, max_token_staleness=1)
    return model, metrics, chunk.token_mask


def test_environment_tokens_never_receive_gradient() -> None:
    """Perturbing only the observations' logprobs and versions leaves the update bit-identical; a model token's
    logprob, or its version, changes it."""
    groups = conversation_groups()
    assert all(len(set(g.trainable)) == 2 for group in groups for g in group.generations)  # both kinds of token
    model, metrics, mask = train(groups)
    assert mask.sum() < sum(len(g.token_ids) for group in groups for g in group.generations)  # env tokens: mask 0
    assert metrics["token_staleness_max"] == 1.0  # the model's tokens only: 4 and 5 against trainer version 5

    same_model, same_metrics, _ = train([perturbed(group, "environment") for group in groups])
    assert same_metrics == metrics
    for a, b in zip(model.parameters(), same_model.parameters(), strict=True):
        assert torch.equal(a, b)

    for control in ("model_logprob", "model_version"):
        control_model, control_metrics, _ = train([perturbed(group, control) for group in groups])
        assert control_metrics["loss"] != metrics["loss"], control
        assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), control_model.parameters(), strict=True))
