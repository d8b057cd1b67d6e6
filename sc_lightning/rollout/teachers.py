"""Teacher scoring for on-policy distillation: each scored group's routed teacher scores its generations before the
group commits, so its rows enter the data plane with their ``teacher_logprobs`` (docs/distillation.md).

A prompt's teacher is the alias its ``on_policy_distillation.route_key`` field names (a dataset column, in
``Prompt.extra``), else ``default_teacher``; :func:`check_routes` checks every dataset row at start. A
:class:`TeacherScorer` (a model in the rollout side's process, or in a Ray actor: built by the composition root)
returns per-token logprobs; :class:`TeacherScoring` runs it under ``teacher_timeout_s`` and turns a failure into a
:class:`TeacherError`, which the rollout manager classifies and retries like an engine's (a dead actor or a missed
deadline is an infra failure; an error of the teacher's own, data). The teachers are a fleet of their own in goodput:
each one's busy time (scoring), idle time and scored tokens (:class:`TeacherTime`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from sc_lightning.config.distillation import DistillationConfig
from sc_lightning.rollout.manager import RolloutError, RolloutTimeout
from sc_lightning.types import Prompt, ScoredGroup, TeacherScores

KNOB = "on_policy_distillation"


class TeacherError(RolloutError):
    """A teacher failed to score a group; names the prompt, the group and the teacher (its cause says why)."""


class UnroutedPromptError(ValueError):
    """A prompt names no known teacher; names the prompt's row and the knob."""


class TeacherScorer(Protocol):
    """An inference-only teacher: per-token logprobs of whole sequences."""

    async def score(self, sequences: Sequence[Sequence[int]], *, temperature: float) -> list[torch.Tensor]:
        """For each sequence of token ids, its (T,) logprobs ``log p(ids[t] | ids[:t])`` (0 at t = 0), or with a
        full-vocabulary teacher its (T, V) logprobs of every vocabulary entry at each position; CPU fp32."""

    async def shutdown(self) -> None:
        """Release the teacher (its actor, its memory)."""


@dataclass(frozen=True)
class TeacherTime:
    """One teacher's goodput accounts since the start: seconds scoring and idle, rows and model tokens scored."""

    busy_s: float = 0.0
    idle_s: float = 0.0
    scored_rows: int = 0
    scored_tokens: int = 0

    @property
    def wall_s(self) -> float:
        """The wall time the accounts cover: busy plus idle."""
        return self.busy_s + self.idle_s


def route(prompt: Prompt, config: DistillationConfig) -> str:
    """The alias of ``prompt``'s teacher: its route_key field, else the default teacher; UnroutedPromptError naming
    the prompt's row and the knob when that is no teacher."""
    named = prompt.extra.get(config.route_key) if config.route_key is not None else None
    alias = str(named) if named is not None else config.default_teacher
    if alias in config.teachers:
        return alias
    row = f"prompt {prompt.prompt_id}" + (f" (dataset row {prompt.index})" if prompt.index is not None else "")
    known = ", ".join(config.aliases())
    if alias is None:
        raise UnroutedPromptError(
            f"{row} has no {config.route_key!r} field and {KNOB}.default_teacher is null; give the row its teacher "
            f"({known}) or set {KNOB}.default_teacher"
        )
    source = f"its {config.route_key!r} field" if named is not None else f"{KNOB}.default_teacher"
    raise UnroutedPromptError(
        f"{row}: {source} names teacher {alias!r}, which {KNOB}.teachers does not have (known: {known}); fix the "
        f"row or add the teacher"
    )


def check_routes(prompts: Iterable[Prompt], config: DistillationConfig) -> dict[str, int]:
    """Route every prompt (UnroutedPromptError at the first that names no teacher); prompts per alias."""
    counts = dict.fromkeys(config.aliases(), 0)
    for prompt in prompts:
        counts[route(prompt, config)] += 1
    return counts


@dataclass
class _Account:
    """A teacher's running goodput: when it started and what it did since."""

    started: float
    busy_s: float = 0.0
    scored_rows: int = 0
    scored_tokens: int = 0


@dataclass
class _Request:
    """Sequences waiting for a teacher's forward pass, and where their rows go."""

    sequences: list[tuple[int, ...]]
    rows: asyncio.Future[list[torch.Tensor]]


class _TeacherQueue:
    """One teacher's requests: one forward pass at a time, and every request that arrives meanwhile goes in the next
    one, so groups that finish together are scored in one forward (batched up to the teacher's ``max_batch_rows``)."""

    def __init__(self, alias: str, scoring: TeacherScoring) -> None:
        self.alias, self.scoring = alias, scoring
        self.scorer, self.account = scoring.scorers[alias], scoring._accounts[alias]
        self.waiting: list[_Request] = []
        self.drain: asyncio.Task[None] | None = None

    async def score(self, sequences: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """The teacher's rows of ``sequences``, from the next forward pass (the scorer's error, or TimeoutError past
        ``teacher_timeout_s``, raised here)."""
        request = _Request(sequences, asyncio.get_running_loop().create_future())
        self.waiting.append(request)
        if self.drain is None or self.drain.done():
            self.drain = asyncio.create_task(self._drain(), name=f"teacher {self.alias}")
        return await request.rows

    async def _drain(self) -> None:
        """Score what waits, one forward at a time, until nothing does; a cancelled caller's request is dropped."""
        while self.waiting:
            batch, self.waiting = [r for r in self.waiting if not r.rows.done()], []
            if not batch:
                continue  # every caller waiting gave up: nothing to score
            sequences = [ids for request in batch for ids in request.sequences]
            started = self.scoring.clock()
            try:
                scored = await asyncio.wait_for(
                    self.scorer.score(sequences, temperature=self.scoring.temperature),
                    self.scoring.config.teacher_timeout_s,
                )
                if len(scored) != len(sequences):
                    raise ValueError(f"returned {len(scored)} rows for {len(sequences)} sequences")
            except Exception as exc:
                scored, failure = [], exc
            else:
                failure = None
            finally:
                self.account.busy_s += self.scoring.clock() - started
            start = 0
            for request in batch:
                if request.rows.done():
                    pass  # its caller gave up meanwhile
                elif failure is not None:
                    request.rows.set_exception(failure)
                else:
                    request.rows.set_result(scored[start : start + len(request.sequences)])
                start += len(request.sequences)


@dataclass
class TeacherScoring:
    """Scores each group with its routed teacher before the commit (the rollout manager's ``teacher_scoring``)."""

    config: DistillationConfig
    scorers: Mapping[str, TeacherScorer]
    temperature: float = 1.0  # the sampling temperature: the teacher scores the same tempered distribution
    clock: Callable[[], float] = time.monotonic
    _accounts: dict[str, _Account] = field(default_factory=dict)
    _queues: dict[str, _TeacherQueue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        now = self.clock()
        self._accounts = {alias: _Account(now) for alias in self.config.aliases()}
        self._queues = {alias: _TeacherQueue(alias, self) for alias in self.scorers}

    async def __call__(self, group: ScoredGroup, group_id: str) -> ScoredGroup:
        """``group`` with its teacher's logprobs (TeacherError naming the teacher when scoring fails or runs past
        ``teacher_timeout_s``)."""
        return (await self.score_groups([group], group_id))[0]

    async def score_groups(self, groups: Sequence[ScoredGroup], group_id: str) -> list[ScoredGroup]:
        """Each of ``groups`` with its routed teacher's logprobs, in order: one scoring request per teacher for all of
        its groups (its forward passes batch up to ``max_batch_rows`` rows). ``group_id`` names them in errors."""
        aliases = [route(group.prompt, self.config) for group in groups]
        out: list[ScoredGroup] = list(groups)
        for alias in dict.fromkeys(aliases):
            mine = [i for i, routed in enumerate(aliases) if routed == alias]
            for i, scored in zip(mine, await self._score(alias, [groups[i] for i in mine], group_id), strict=True):
                out[i] = scored
        return out

    async def _score(self, alias: str, groups: Sequence[ScoredGroup], group_id: str) -> list[ScoredGroup]:
        """``groups`` (all routed to ``alias``) scored by that teacher in one request (its forward may hold other
        requests' too), under the timeout."""
        engine, first = f"teacher {alias}", groups[0].prompt.prompt_id
        prompt_id = first if len(groups) == 1 else f"{first} and {len(groups) - 1} more"
        sequences = [(*group.prompt.token_ids, *g.token_ids) for group in groups for g in group.generations]
        try:
            scored = await self._queues[alias].score(sequences)
        except TimeoutError:
            raise RolloutTimeout(
                f"scoring exceeded {KNOB}.teacher_timeout_s={self.config.teacher_timeout_s}",
                prompt_id=prompt_id,
                group_id=group_id,
                engine=engine,
            ) from None
        except Exception as exc:
            raise TeacherError(
                f"{type(exc).__name__}: {exc}", prompt_id=prompt_id, group_id=group_id, engine=engine
            ) from exc
        rows = iter(scored)
        out = []
        for group in groups:
            length = len(group.prompt.token_ids)
            logprobs = tuple(_model_tokens_only(next(rows), length, g.trainable) for g in group.generations)
            account = self._accounts[alias]
            account.scored_rows += len(logprobs)
            account.scored_tokens += sum(g.model_token_count for g in group.generations)
            teacher = TeacherScores(alias, self.config.aliases().index(alias), logprobs)
            out.append(ScoredGroup(group.prompt, group.generations, group.rewards, group.masked, teacher))
        return out

    def snapshot(self) -> dict[str, TeacherTime]:
        """Each teacher's goodput accounts now."""
        now = self.clock()
        return {
            alias: TeacherTime(a.busy_s, now - a.started - a.busy_s, a.scored_rows, a.scored_tokens)
            for alias, a in self._accounts.items()
        }

    async def shutdown(self) -> None:
        """Stop scoring and shut every teacher down."""
        for queue in self._queues.values():
            if queue.drain is not None:
                queue.drain.cancel()
        for scorer in self.scorers.values():
            await scorer.shutdown()


def _model_tokens_only(logprobs: torch.Tensor, prompt_length: int, trainable: Sequence[bool]) -> torch.Tensor:
    """A row's teacher logprobs with the prompt's and the environment's tokens zeroed, fp32 on the CPU."""
    row = logprobs.detach().to("cpu", torch.float32).clone()
    keep = torch.zeros(row.shape[0], dtype=torch.bool)
    keep[prompt_length:] = torch.tensor(list(trainable), dtype=torch.bool)
    row[~keep] = 0.0
    return row
