"""The multi-turn SampleSource: each sample of a prompt group is one conversation played with the served engine.

Set as ``RolloutManager.sample_source`` (``env.name`` naming a multi-turn environment makes build do it). Each model
turn is one ``engine.generate`` call seeded from the sample's seed and the turn, under ``generation_timeout_s`` (a
RolloutTimeout naming the prompt, group, engine and turn); each episode step runs in a worker thread under
``env_timeout_s``. The sample's Generation holds every token after the prompt (model turns and observations), with
the engine's logprobs on model tokens and 0.0 on environment tokens, per-token versions, and ``trainable`` marking
the model's tokens; its ``weight_version`` is the first turn's. The conversation's final reward is its score.
With token capture the manager calls :meth:`MultiTurnSource.resume` with the sample's
:class:`~sc_lightning.rollout.multiturn.record.TurnRecord`: a retried, evicted or restored conversation goes on after
its last sealed turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from sc_lightning.rollout.envs.daemon_call import daemon_call
from sc_lightning.rollout.manager import RolloutTimeout, Sample
from sc_lightning.rollout.multiturn.chat import ChatTemplate, chat_template_for
from sc_lightning.rollout.multiturn.driver import ConversationOutcome, Verdict, run_conversation
from sc_lightning.rollout.multiturn.protocol import Episode, MultiTurnEnvironment, TurnLimits
from sc_lightning.rollout.multiturn.record import ReplayDiverged, TurnRecord
from sc_lightning.types import Generation, Prompt

if TYPE_CHECKING:
    from sc_lightning.rollout.manager import RolloutManager

log = logging.getLogger(__name__)


class ScoredByEpisodes:
    """The rollout manager's single-turn environment in a multi-turn run: never asked, every conversation scores
    itself (its ``name`` is the multi-turn environment's, for error messages)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """Refuse: a multi-turn sample is scored by its episode."""
        raise RuntimeError(f"prompt {prompt.prompt_id}: {self.name} scores whole conversations, not completion text")


def attach_multiturn(manager: RolloutManager, environment: MultiTurnEnvironment, limits: TurnLimits) -> None:
    """Make ``manager`` play conversations of ``environment``, rendered by its tokenizer's chat template."""
    manager.environment = ScoredByEpisodes(environment.name)
    manager.sample_source = MultiTurnSource(manager, environment, chat_template_for(manager.tokenizer), limits)


class MultiTurnSource:
    """Plays one conversation of ``environment`` per sample with ``manager``'s engine and settings."""

    def __init__(
        self, manager: RolloutManager, environment: MultiTurnEnvironment, template: ChatTemplate, limits: TurnLimits
    ) -> None:
        self.manager = manager
        self.environment = environment
        self.template = template
        self.limits = limits

    async def sample(self, prompt: Prompt, group_id: str, seed: int) -> Sample:
        """One conversation of ``prompt``: its tokens after the prompt as a Generation, its final reward as score."""
        return await self.resume(prompt, group_id, seed, TurnRecord())

    async def resume(self, prompt: Prompt, group_id: str, seed: int, record: TurnRecord) -> Sample:
        """The conversation of ``record``: as kept once finished; else played on after its sealed turns, each new
        turn and then the outcome sealed into it (a replay that diverges plays the conversation again whole)."""
        if record.generation is not None and record.score is not None:
            return Sample(record.generation, record.score)
        manager = self.manager

        def timeout(what: str, limit: float | None, turn: int) -> RolloutTimeout:
            """The RolloutTimeout of ``turn`` naming the prompt, group, engine and the deadline ``what``."""
            return RolloutTimeout(
                f"turn {turn}: {what} exceeded {limit} s",
                prompt_id=prompt.prompt_id,
                group_id=group_id,
                engine=manager.engine.name,
            )

        async def generate(token_ids: tuple[int, ...], budget: int, turn: int) -> Generation:
            """One model turn from the served engine, seeded per turn, under generation_timeout_s."""
            settings = manager.settings
            params = dataclasses.replace(
                settings.sampling,
                seed=(seed + turn - 1) % 2**63,
                max_new_tokens=min(settings.sampling.max_new_tokens, budget),
            )
            wait_for = getattr(manager.engine, "active_wait_for", asyncio.wait_for)
            try:
                return await wait_for(manager.engine.generate(token_ids, params), settings.generation_timeout_s)
            except TimeoutError:
                raise timeout("generation_timeout_s", settings.generation_timeout_s, turn) from None

        async def step(episode: Episode, model_text: str, turn: int) -> Verdict:
            """One episode step on a daemon thread under env_timeout_s."""
            limit = manager.settings.env_timeout_s
            try:
                return await asyncio.wait_for(daemon_call(episode.step, model_text), limit)
            except TimeoutError:
                raise timeout(f"environment {self.environment.name} env_timeout_s", limit, turn) from None

        def play() -> Awaitable[ConversationOutcome]:
            """The conversation, from ``record``'s sealed turns on."""
            tokenizer = manager.tokenizer
            return run_conversation(
                prompt, self.environment, self.template, tokenizer, generate, self.limits, step, record
            )

        try:
            outcome = await play()
        except ReplayDiverged as diverged:
            log.warning(
                "%s (group %s): its sealed turns are dropped, the conversation is played again", diverged, group_id
            )
            record.turns.clear()
            outcome = await play()
        record.generation = conversation_generation(outcome, manager.weight_version)
        record.score = outcome.score
        return Sample(record.generation, record.score)


def conversation_generation(outcome: ConversationOutcome, served_version: int) -> Generation:
    """The conversation's tokens after the prompt as one Generation: model tokens trainable with the engine's
    logprobs and versions, environment tokens not; its ``weight_version`` is the first model token's
    (``served_version`` when the model never spoke)."""
    conv = outcome.conversation
    start = conv.prompt_length
    model_versions = [v for v, t in zip(conv.token_versions, conv.trainable, strict=True) if t]
    return Generation(
        conv.token_ids[start:],
        conv.logprobs[start:],
        outcome.finish_reason,
        model_versions[0] if model_versions else served_version,
        conv.token_versions[start:],
        conv.trainable[start:],
    )
