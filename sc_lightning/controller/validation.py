"""Validation beside the rollouts: one pinned weight version per validation, a bounded share of the engine.

A validation of RL step N generates one completion per validation prompt with the weights of version N and scores
it with the training environment. How the version is pinned: the controller starts it right after the engine
adopted N (``finish_refit(N)``, or at once for a resumed or a first step), and the refit to N + 1 — which is the
only thing that changes the engine's weights — first settles it (:meth:`Validator.settle`, under
``{algo}.val_timeout_s``, a ValidationTimeout naming the step and engine past it). So every validation request
starts and ends on version N, whether refits leave rollouts in flight or drain them; each completion's
``Generation.weight_version`` is checked against the engine's version at the start all the same. A colocated
engine stands down for each train step, so the stand-down settles the validation first too.

The pass itself — one seeded completion per prompt, scored by the environment — is
:func:`~sc_lightning.rollout.answers.answer_prompts`, which the ``generate`` command runs too. Rollouts keep
flowing: at most ``{algo}.val_batch_size`` validation requests are in flight at once, beside the
rollouts' ``max_inflight_prompts`` groups; the refit after a validation's step waits only for what is left of it.

In an on-policy distillation run each completion is then scored by its prompt's routed teacher (the rollouts'
:class:`~sc_lightning.rollout.teachers.TeacherScoring`, one request per teacher for the whole validation), and the
result carries per teacher the estimate of KL(student || teacher) on the validation completions
(:class:`~sc_lightning.controller.api.TeacherAgreement`; docs/validation.md says why that measure).

Validation is a separate path: its prompts never come from the training stream, and its completions never reach
the replay buffer, the data plane, the recovery ledger or ``train_data.jsonl``. Results wait in
:meth:`Validator.take_results` until the trainer side logs them at their step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sc_lightning.controller.api import TeacherAgreement, ValidationResult
from sc_lightning.engines.base import GenerationEngine
from sc_lightning.rollout.answers import Answer, AnswerError, AnswerSettings, answer_prompts
from sc_lightning.rollout.envs.base import Environment
from sc_lightning.rollout.manager import RolloutError
from sc_lightning.rollout.teachers import TeacherScoring
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import Prompt, ScoredGroup


class ValidationError(RuntimeError):
    """A validation failed or broke its pin; names the step and the engine."""


class ValidationTimeout(ValidationError):
    """A validation outlived ``{algo}.val_timeout_s`` while a refit or a stand-down waited for it."""


@dataclass
class ValidationSettings:
    """How validations run: which steps, under which deadline, and how each answers its prompts (sampling, requests
    at once, seed, each request's deadline)."""

    due: Callable[[int], bool]
    timeout_s: float
    answering: AnswerSettings


class Validator:
    """Runs one validation at a time on the engine, at the version the engine holds; keeps finished results."""

    def __init__(
        self,
        prompts: Sequence[Prompt],
        environment: Environment,
        tokenizer: Tokenizer,
        settings: ValidationSettings,
        teachers: TeacherScoring | None = None,
    ) -> None:
        """``teachers``: a distillation run's teachers, which score every validation completion (None: none)."""
        if not prompts:
            raise ValidationError("the validation set is empty")
        self.prompts, self.environment, self.tokenizer, self.settings = list(prompts), environment, tokenizer, settings
        self.teachers = teachers
        self._task: asyncio.Task[ValidationResult] | None = None
        self._step: int | None = None
        self._results: list[ValidationResult] = []

    @property
    def running_step(self) -> int | None:
        """The step of the validation in flight, if any."""
        return self._step if self._task is not None and not self._task.done() else None

    def start(self, step: int, engine: GenerationEngine) -> None:
        """Start validating ``step`` with the weights ``engine`` holds now (the previous validation is settled)."""
        if self._task is not None and not self._task.done():
            raise ValidationError(f"step {step}: the validation of step {self._step} is still running")
        self._collect()
        self._step = step
        self._task = asyncio.create_task(self._run(step, engine), name=f"validation step {step}")

    async def settle(self, engine: GenerationEngine) -> None:
        """Wait for the validation in flight (before the engine's weights change); its failure is raised here."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self.settings.timeout_s)
        except TimeoutError:
            self._task.cancel()
            raise ValidationTimeout(
                f"step {self._step}: the validation on engine {engine.name!r} did not finish within "
                f"val_timeout_s={self.settings.timeout_s} (a smaller max_val_samples or a larger val_batch_size "
                "shortens it)"
            ) from None
        self._collect()

    def cancel(self) -> None:
        """Stop the validation in flight (the controller is shutting down); it is not reported."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def take_results(self) -> list[ValidationResult]:
        """The validations finished since the last call, oldest first."""
        self._collect()
        results, self._results = self._results, []
        return results

    def _collect(self) -> None:
        """Move a finished validation's result to the results (its failure, if any, is raised)."""
        if self._task is not None and self._task.done():
            task, self._task = self._task, None
            self._results.append(task.result())

    async def _run(self, step: int, engine: GenerationEngine) -> ValidationResult:
        version, started = engine.weight_version, time.monotonic()
        try:
            done = await answer_prompts(self.prompts, engine, self.environment, self.tokenizer, self.settings.answering)
        except AnswerError as failure:
            raise ValidationError(f"step {step}: the validation failed: {failure}") from failure
        off = sorted({answer.generation.weight_version for answer in done} - {version})
        if off:
            raise ValidationError(
                f"step {step}: validation completions on engine {engine.name!r} were generated at weight version(s) "
                f"{off}, not the pinned {version}"
            )
        teachers = await self._agreement(step, done)
        return ValidationResult(
            step=step,
            weight_version=version,
            rewards=tuple(answer.score.reward for answer in done),
            completion_lengths=tuple(len(answer.generation.token_ids) for answer in done),
            generation_versions=tuple(answer.generation.weight_version for answer in done),
            seconds=time.monotonic() - started,
            teachers=teachers,
        )

    async def _agreement(self, step: int, done: Sequence[Answer]) -> tuple[TeacherAgreement, ...]:
        """Each teacher's agreement with the completions routed to it (none without teachers)."""
        if self.teachers is None:
            return ()
        groups = [ScoredGroup(answer.prompt, (answer.generation,), (answer.score.reward,)) for answer in done]
        try:
            scored = await self.teachers.score_groups(groups, f"validation of step {step}")
        except RolloutError as failure:
            raise ValidationError(f"step {step}: the validation's teacher scoring failed: {failure}") from failure
        rows: dict[str, list[tuple[float, float, int]]] = {alias: [] for alias in self.teachers.config.aliases()}
        for group in scored:
            assert group.teacher is not None
            rows[group.teacher.alias].append((group.rewards[0], *_student_teacher_gap(group)))
        return tuple(
            TeacherAgreement(
                alias, len(mine), sum(r for r, _, _ in mine), sum(g for _, g, _ in mine), sum(t for *_, t in mine)
            )
            for alias, mine in rows.items()
        )


def _student_teacher_gap(group: ScoredGroup) -> tuple[float, int]:
    """A one-completion group's sum over its model tokens of ``log pi_student - log pi_teacher`` (the sampled
    token's; a full-vocabulary teacher's row is read at it), and the number of those tokens."""
    assert group.teacher is not None
    generation, row = group.generations[0], group.teacher.logprobs[0][len(group.prompt.token_ids) :]
    ids = torch.tensor(generation.token_ids, dtype=torch.long)
    teacher = row.gather(1, ids[:, None])[:, 0] if row.dim() == 2 else row
    student = torch.tensor(generation.logprobs, dtype=torch.float32)
    model = torch.tensor(generation.trainable, dtype=torch.bool)
    return float((student - teacher)[model].sum()), int(model.sum())
