"""RolloutManager.generate_and_push: one prompt group from dispatch to committed training rows.

Per call: reserve a buffer slot stamped with the served policy's version, sample N completions of the
prompt concurrently (each under ``generation_timeout_s``), score them with the environment (in a worker thread,
under ``env_timeout_s``), and commit the group with the versions seen at start and end. A ``SampleSource`` replaces
the one-completion sample with a whole rollout that scores itself (a multi-turn conversation, an external agent).

Any failure or cancellation removes the slot, so the buffer never holds a group that will not commit; a failed
attempt is retried within ``async_rl.rollout_failure``'s budgets (a distillation teacher's scoring, just before the
commit, is part of the attempt); once they are spent the controller drops the group within its drop budgets
(``controller/drops.py``) or stops the run. Every attempt's engine time and tokens go to the goodput accounts
(``rollout/goodput.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sc_lightning.engines.base import GenerationEngine
from sc_lightning.rollout.envs.base import Environment, Score, as_score, request_sampling
from sc_lightning.rollout.envs.daemon_call import daemon_call
from sc_lightning.rollout.failures import RetryBudget, classify
from sc_lightning.rollout.goodput import EngineGoodput
from sc_lightning.rollout.images import engine_images
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import Generation, Prompt, SamplingParams, ScoredGroup

if TYPE_CHECKING:
    from sc_lightning.rollout.multiturn.record import TurnRecord


class RolloutError(RuntimeError):
    """A prompt group failed to roll out; names the prompt, the group and the engine."""

    def __init__(self, message: str, *, prompt_id: str, group_id: str, engine: str) -> None:
        super().__init__(f"prompt {prompt_id} (group {group_id}, engine {engine}): {message}")
        self.prompt_id = prompt_id
        self.group_id = group_id
        self.engine = engine


class RolloutTimeout(RolloutError):
    """A generation request or an environment step outlived its deadline."""


class GroupFiltered(Exception):
    """A scored prompt group was filtered before its commit (``RolloutManager.group_filter``); never retried."""

    def __init__(self, *, prompt_id: str, group_id: str, reason: str, rewards: Sequence[float]) -> None:
        super().__init__(f"prompt {prompt_id} (group {group_id}) filtered: {reason}, rewards {list(rewards)}")
        self.prompt_id, self.group_id, self.reason, self.rewards = prompt_id, group_id, reason, tuple(rewards)


class GroupSink(Protocol):
    """Where rollouts go: the replay buffer's reserve/commit/discard."""

    def reserve(self, *, prompt_id: str, weight_version: int, target_step: int | None) -> str:
        """Append an unready slot; returns the group id."""

    async def commit(self, group_id: str, group: ScoredGroup, *, start_weight: int, end_weight: int) -> Any:
        """Write the group's rows and flip its slot ready."""

    def discard_if_present(self, group_id: str) -> Any:
        """Drop a slot that will not commit."""


@dataclass(frozen=True)
class Sample:
    """One sample of a prompt group: its generation and, when the rollout scored it itself, its score.

    A single-turn completion leaves ``score`` None (the environment scores the group's texts once all are done); a
    multi-turn conversation or an external agent's run ends with its own reward.
    """

    generation: Generation
    score: Score | None = None


class SampleSource(Protocol):
    """Produces each sample of a prompt group in place of one engine completion (a conversation, an agent's run)."""

    async def sample(self, prompt: Prompt, group_id: str, seed: int) -> Sample:
        """Roll out one sample of ``prompt`` for group ``group_id``, sampling with ``seed``."""


@runtime_checkable
class TurnResumable(Protocol):
    """A SampleSource whose samples go on after their last sealed turn (a multi-turn conversation, token capture)."""

    async def resume(self, prompt: Prompt, group_id: str, seed: int, record: TurnRecord) -> Sample:
        """The sample of ``record``: kept whole once finished, else played on after its sealed turns (sealing the
        new ones into it)."""


def sample_seed(run_seed: int, prompt_id: str, visit: int, index: int) -> int:
    """The sampling seed of a prompt's ``index``-th generation on its ``visit``-th rollout (0 = the first) in a run
    seeded ``run_seed``: fixed by those, so reproducible whatever the timing."""
    key = f"{run_seed}/{prompt_id}/{visit}/{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


@dataclass
class RolloutSettings:
    """How each prompt group is generated and scored."""

    generations_per_prompt: int
    sampling: SamplingParams
    generation_timeout_s: float | None
    env_timeout_s: float | None
    seed: int = 0
    refit_timeout_s: float | None = None
    rollout_timeout_s: float | None = None  # the whole group, retries included
    max_infra_attempts: int = 1  # async_rl.rollout_failure budgets (1 = no retry)
    max_data_attempts: int = 1
    backoff_base_s: float = 1.0
    max_backoff_s: float = 30.0

    def retry_budget(self) -> RetryBudget:
        """A fresh attempt budget for one prompt group."""
        return RetryBudget(self.max_infra_attempts, self.max_data_attempts, self.backoff_base_s, self.max_backoff_s)


@dataclass
class InflightGroup:
    """A group being generated: the task doing it and the weight version it started on."""

    task: asyncio.Task | None
    start_weight: int
    prompt_id: str


@dataclass
class ServedPolicy:
    """The generation engine and the policy version new rollouts are stamped with.

    The controller owns it and advances ``version`` at each refit (a PPO critic warm-up advances it without pushing
    weights, so it is not the engine's own weight version); the rollout manager only reads it.
    """

    engine: GenerationEngine
    version: int = 0


@dataclass
class RolloutManager:
    """Turns prompts into committed prompt groups with the served policy; tracks the groups in flight and their
    engine goodput (``goodput``: the controller reports what became of each committed group)."""

    served: ServedPolicy
    environment: Environment
    tokenizer: Tokenizer
    sink: GroupSink
    settings: RolloutSettings
    inflight: dict[str, InflightGroup] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=lambda: {"infra": 0, "data": 0, "redispatched": 0})
    goodput: EngineGoodput = field(default_factory=EngineGoodput)
    reward_transform: Callable[[ScoredGroup], ScoredGroup] | None = None  # scaling / overlong shaping, then:
    group_filter: Callable[[ScoredGroup], str | None] | None = None  # a reason filters the group before its commit
    teacher_scoring: Callable[[ScoredGroup, str], Awaitable[ScoredGroup]] | None = None  # distillation: the routed
    # teacher's logprobs, added to a group that passed the filter (rollout/teachers.py); its failures retry as ours
    sample_source: SampleSource | None = None  # None: one engine completion per sample, scored by ``environment``
    _visits: dict[str, int] = field(default_factory=dict)

    @property
    def engine(self) -> GenerationEngine:
        """The engine that generates the completions."""
        return self.served.engine

    @property
    def weight_version(self) -> int:
        """The policy version a rollout starting now is stamped with."""
        return self.served.version

    async def generate_and_push(
        self,
        prompt: Prompt,
        *,
        target_step: int | None = None,
        sealed: dict[int, Generation] | None = None,
        conversations: dict[int, TurnRecord] | None = None,
    ) -> Any:
        """Reserve, roll out and commit one prompt group; returns what the sink's commit returns.

        The whole group, retries included, must finish within ``rollout_timeout_s`` (a RolloutTimeout, not retried).
        A failed attempt is classified (:func:`~sc_lightning.rollout.failures.classify`) and retried within the
        settings' budgets — after a back-off for infrastructure failures, at once for data failures — each attempt
        under a fresh group id; the last failure is raised once a budget is spent. ``failures`` counts them.
        ``sealed`` (token capture): generations already finished, by index, are reused (across retries too); each
        one finishing now is added to it as soon as it finishes. The group's start weight is then its oldest
        generation's version. ``conversations`` (token capture, a turn-resumable sample source): each sample's
        :class:`~sc_lightning.rollout.multiturn.record.TurnRecord` by index (a mapping that makes one on first use),
        likewise kept across retries: a conversation goes on after its last sealed turn.
        """
        # the whole group, retries included, under rollout_timeout_s (on the engine's active clock when it has one)
        wait_for = getattr(self.engine, "active_wait_for", asyncio.wait_for)
        try:
            rollout = self._with_retries(prompt, target_step, sealed, conversations)
            return await wait_for(rollout, self.settings.rollout_timeout_s)
        except TimeoutError:
            self._waste_sealed(sealed, conversations)
            raise RolloutTimeout(
                f"the prompt group exceeded rollout_timeout_s={self.settings.rollout_timeout_s}",
                prompt_id=prompt.prompt_id,
                group_id="-",
                engine=self.engine.name,
            ) from None
        except BaseException:  # dropped (retries spent) or aborted: completions kept for a retry are waste too
            self._waste_sealed(sealed, conversations)
            raise

    def _waste_sealed(self, sealed: dict[int, Generation] | None, conversations: dict[int, TurnRecord] | None) -> None:
        kept = sum(generation.model_token_count for generation in (sealed or {}).values())
        kept += sum(record.model_token_count for record in (conversations or {}).values())
        if kept:
            self.goodput.wasted_tokens(kept)

    async def _with_retries(
        self,
        prompt: Prompt,
        target_step: int | None,
        sealed: dict[int, Generation] | None,
        conversations: dict[int, TurnRecord] | None,
    ) -> Any:
        budget = self.settings.retry_budget()
        while True:
            try:
                return await self._attempt(prompt, target_step, sealed, conversations)
            except RolloutError as failure:
                kind = classify(failure)
                self.failures[kind] += 1
                if not budget.record(kind):
                    if budget.attempts > 1:
                        failure.add_note(
                            f"gave up after {budget.attempts} attempts ({budget.infra} infra, {budget.data} data)"
                        )
                    raise
                self.failures["redispatched"] += 1
                await asyncio.sleep(budget.backoff_s(kind))  # the back-off itself: a policy, not a synchronisation

    async def _attempt(
        self,
        prompt: Prompt,
        target_step: int | None,
        sealed: dict[int, Generation] | None,
        conversations: dict[int, TurnRecord] | None,
    ) -> Any:
        kept = [g.weight_version for g in (sealed or {}).values()]
        kept += [r.oldest_version for r in (conversations or {}).values() if r.oldest_version is not None]
        start = min([self.weight_version, *kept])
        group_id = self.sink.reserve(prompt_id=prompt.prompt_id, weight_version=start, target_step=target_step)
        self.inflight[group_id] = InflightGroup(asyncio.current_task(), start, prompt.prompt_id)
        self.goodput.started(group_id)
        try:
            try:
                group = await self.run_rollout(prompt, group_id, sealed, conversations)
            finally:
                self.inflight.pop(group_id, None)  # before commit, so an abort cannot interrupt the commit
            if self.reward_transform is not None:
                group = self.reward_transform(group)
            reason = None if self.group_filter is None else self.group_filter(group)
            if reason is not None:
                raise GroupFiltered(prompt_id=prompt.prompt_id, group_id=group_id, reason=reason, rewards=group.rewards)
            if self.teacher_scoring is not None:
                group = await self.teacher_scoring(group, group_id)
            committed = await self.sink.commit(group_id, group, start_weight=start, end_weight=self.weight_version)
        except BaseException as exc:
            self.goodput.failed(group_id)
            self.sink.discard_if_present(group_id)
            if isinstance(exc, (RolloutError, GroupFiltered)) or not isinstance(exc, Exception):
                raise
            raise self._error(f"{type(exc).__name__}: {exc}", prompt, group_id) from exc
        self.goodput.committed(group_id, tokens=sum(g.model_token_count for g in group.generations))
        return committed

    async def run_rollout(
        self,
        prompt: Prompt,
        group_id: str,
        sealed: dict[int, Generation] | None = None,
        conversations: dict[int, TurnRecord] | None = None,
    ) -> ScoredGroup:
        """Generate N completions concurrently (the first failure cancels the rest) and score them.

        Indices already in ``sealed`` are not generated again; with ``sealed`` given, each new generation is
        sealed into it the moment it finishes. With a ``sample_source`` each sample is its rollout (a conversation,
        an agent's run) and keeps the score it ended with; nothing goes in ``sealed`` (an episode cannot be rescored
        later), but a turn-resumable source keeps each sample's turns and outcome in its record in ``conversations``.
        """

        own_scores: dict[int, Score] = {}
        source = self.sample_source
        resumable = source if isinstance(source, TurnResumable) else None
        records = conversations if resumable is not None else None
        if source is not None:
            sealed = None  # a sample scored by its own rollout (an episode's state) cannot be rescored from text

        async def one(index: int, seed: int) -> Generation:
            if source is None:
                generation = await self._generate(prompt, group_id, seed)
            else:
                if resumable is not None and records is not None:
                    sample = await resumable.resume(prompt, group_id, seed, records[index])
                else:
                    sample = await source.sample(prompt, group_id, seed)
                generation = sample.generation
                if sample.score is not None:
                    own_scores[index] = sample.score
            if sealed is not None:
                sealed[index] = generation  # kept for a retry: its tokens count when the prompt's fate is known
            elif records is None:
                self.goodput.generated(group_id, generation.model_token_count)  # else kept in its record, likewise
            return generation

        done = dict(sealed or {})
        try:
            async with asyncio.TaskGroup() as group:
                visit = self._visits[prompt.prompt_id] = self._visits.get(prompt.prompt_id, -1) + 1
                tasks = {
                    index: group.create_task(one(index, self._sample_seed(prompt, visit, index)))
                    for index in range(self.settings.generations_per_prompt)
                    if index not in done
                }
        except ExceptionGroup as failures:  # the first failure cancelled its siblings; report that one
            raise failures.exceptions[0] from None
        done.update((index, task.result()) for index, task in tasks.items())
        generations = [done[index] for index in range(self.settings.generations_per_prompt)]
        unscored = [index for index in range(len(generations)) if index not in own_scores]
        texts = [self.tokenizer.decode(generations[index].token_ids) for index in unscored]
        scored = dict(zip(unscored, await self._score(prompt, group_id, texts), strict=True)) if unscored else {}
        scored.update(own_scores)
        scores = [scored[index] for index in range(len(generations))]
        self._check_finite(prompt, group_id, scores)
        masked = frozenset(i for i, score in enumerate(scores) if score.mask_sample)
        return ScoredGroup(prompt, tuple(generations), tuple(score.reward for score in scores), masked)

    def _sample_seed(self, prompt: Prompt, visit: int, index: int) -> int:
        return sample_seed(self.settings.seed, prompt.prompt_id, visit, index)

    async def _generate(self, prompt: Prompt, group_id: str, seed: int) -> Generation:
        sampling = dataclasses.replace(self.settings.sampling, seed=seed)
        shape = request_sampling(self.environment)  # an environment may set each request's sampling
        sampling = sampling if shape is None else shape(prompt, sampling)
        request = self.engine.generate(prompt.token_ids, sampling, **engine_images(prompt))  # a VLM's: the images
        # an engine with an active-time clock excludes the time it is stood down (colocated) from the deadline
        wait_for = getattr(self.engine, "active_wait_for", asyncio.wait_for)
        try:
            return await wait_for(request, self.settings.generation_timeout_s)
        except TimeoutError:
            limit = self.settings.generation_timeout_s
            raise self._error(
                f"generation exceeded generation_timeout_s={limit}", prompt, group_id, RolloutTimeout
            ) from None

    async def _score(self, prompt: Prompt, group_id: str, texts: Sequence[str]) -> list[Score]:
        scoring = daemon_call(lambda: [as_score(self.environment.score(prompt, text)) for text in texts])
        try:
            scores = await asyncio.wait_for(scoring, self.settings.env_timeout_s)
        except TimeoutError:
            limit = self.settings.env_timeout_s
            raise self._error(
                f"environment {self.environment.name} exceeded env_timeout_s={limit}", prompt, group_id, RolloutTimeout
            ) from None
        return scores

    def _check_finite(self, prompt: Prompt, group_id: str, scores: Sequence[Score]) -> None:
        bad = [(i, s.reward) for i, s in enumerate(scores) if not math.isfinite(s.reward)]
        if bad:  # a data failure: retried within the data budget, never trained on
            raise self._error(
                f"environment {self.environment.name} returned non-finite rewards (generation, reward): {bad}",
                prompt,
                group_id,
            )

    def _error(
        self, message: str, prompt: Prompt, group_id: str, kind: type[RolloutError] = RolloutError
    ) -> RolloutError:
        return kind(message, prompt_id=prompt.prompt_id, group_id=group_id, engine=self.engine.name)
