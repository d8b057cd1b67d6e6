"""Validation in an on-policy distillation run: each validation completion is scored by its prompt's routed teacher,
and ``val/teacher_*/<alias>`` say how close the student is to each teacher, on a case small enough to check by hand.

The controller, its validator, the validation set (a dataset file with a route column), the environment and the
teacher scoring are real; the engine is the FAKE ScriptedEngine (every token's logprob -0.5) and the teachers are
FAKE scorers with a constant logprob per token (a model's logprobs would not be checkable by hand).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from sc_lightning.config import SCConfig, load_config
from sc_lightning.controller.api import ValidationResult
from sc_lightning.controller.build import build_controller
from sc_lightning.controller.controller import SingleController
from sc_lightning.controller.validation import ValidationError
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.datasets import ArithmeticDataset
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.rollout.teachers import TeacherScoring, UnroutedPromptError
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.scripts import TOKENIZER

# problem, expected answer, teacher column (None: no column, so the default teacher), the scripted completion
ROWS = [("1+2=", "3", "add", "3"), ("3+4=", "7", "add", "7"), ("2*3=", "6", "mul", "60"), ("3*3=", "9", None, "90")]


def distill_config(val_file: Path) -> SCConfig:
    """A small opd config validating ``val_file``: teachers add and mul, routed by the ``teacher`` column."""
    return load_config(
        {
            "grpo": {
                "num_prompts_per_step": 2,
                "num_generations_per_prompt": 2,
                "max_num_epochs": 1,
                "seed": 3,
                "val_period": 1,
                "val_batch_size": 2,
                "adv_estimator": {"name": "opd"},
            },
            "on_policy_distillation": {
                "teachers": {"add": {"model_name": "builtin:tiny"}, "mul": {"model_name": "builtin:tiny"}},
                "route_key": "teacher",
                "default_teacher": "mul",
            },
            "policy": {"train_global_batch_size": 4, "generation": {"max_new_tokens": 3}},
            "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 1}},
            "data_plane": {"backend": "memory"},
            "data": {"val_dataset_name": str(val_file)},
        }
    )


class ConstantTeacher:
    """FAKE teacher: the logprob ``value`` for every token of every sequence; records each request's sequences.

    With a ``vocabulary`` it answers as a full-vocabulary teacher: (T, V) rows holding ``value`` at each position's
    own token and -9 everywhere else."""

    def __init__(self, value: float, error: BaseException | None = None, vocabulary: int | None = None) -> None:
        self.value, self.error, self.vocabulary = value, error, vocabulary
        self.requests: list[list[tuple[int, ...]]] = []

    async def score(self, sequences: Sequence[Sequence[int]], *, temperature: float) -> list[torch.Tensor]:
        """``value`` at each position (or the injected ``error``)."""
        self.requests.append([tuple(ids) for ids in sequences])
        if self.error is not None:
            raise self.error
        if self.vocabulary is None:
            return [torch.full((len(ids),), self.value) for ids in sequences]
        rows = [torch.full((len(ids), self.vocabulary), -9.0) for ids in sequences]
        for row, ids in zip(rows, sequences, strict=True):
            row[torch.arange(len(ids)), torch.tensor(list(ids))] = self.value
        return rows

    async def shutdown(self) -> None:
        """Nothing to release."""


def scripted(prompt: tuple[int, ...], call: int) -> tuple[int, ...]:
    """The completion ROWS scripts for ``prompt``."""
    text = TOKENIZER.decode(prompt)
    return tuple(TOKENIZER.encode(next(completion for problem, *_, completion in ROWS if problem == text)))


def distill_controller(
    tmp_path: Path, teachers: dict[str, ConstantTeacher], rows: Sequence[tuple[str, str, str | None, str]] = ROWS
) -> tuple[SingleController, ScriptedEngine]:
    """A controller validating ``rows`` (as a dataset file) with ``teachers``, and its engine (nothing started)."""
    val_file = tmp_path / "val.jsonl"
    with val_file.open("w") as out:
        for problem, expected, teacher, _ in rows:
            row = {"problem": problem, "expected_answer": expected}
            out.write(json.dumps(row | ({"teacher": teacher} if teacher else {})) + "\n")
    config = distill_config(val_file)
    assert config.on_policy_distillation is not None
    engine = ScriptedEngine(scripted)
    controller = build_controller(
        config,
        data_plane=MemoryDataPlane(),
        engine=engine,
        environment=ArithmeticEnvironment(),
        tokenizer=TOKENIZER,
        dataset=ArithmeticDataset(8, 0, TOKENIZER),
        teachers=TeacherScoring(config.on_policy_distillation, teachers),
    )
    return controller, engine


def validate_once(tmp_path: Path, teachers: dict[str, ConstantTeacher]) -> ValidationResult:
    """Run the validator of :func:`distill_controller` once at step 0 (no rollouts start)."""
    controller, engine = distill_controller(tmp_path, teachers)
    validator = controller.validator
    assert validator is not None

    async def scenario() -> ValidationResult:
        validator.start(0, engine)
        await validator.settle(engine)
        (result,) = validator.take_results()
        return result

    return asyncio.run(scenario())


@pytest.mark.parametrize("vocabulary", [None, TOKENIZER.vocab_size])
def test_each_teacher_s_agreement_with_the_student_is_logged_with_the_hand_computed_value(
    tmp_path: Path, vocabulary: int | None
) -> None:
    """add's 2 completions (1 token each, right) and mul's 2 (2 tokens each, wrong; one by the default route):
    KL per token = student -0.5 minus teacher's logprob, i.e. 1.0 for add (teacher -1.5) and 0.25 for mul (-0.75);
    a full-vocabulary teacher's row is read at the student's token."""
    teachers = {
        "add": ConstantTeacher(-1.5, vocabulary=vocabulary),
        "mul": ConstantTeacher(-0.75, vocabulary=vocabulary),
    }
    metrics = validate_once(tmp_path, teachers).metrics()
    assert {name: value for name, value in metrics.items() if name.startswith("val/teacher")} == {
        "val/teacher_kl/add": pytest.approx(1.0),
        "val/teacher_kl/mul": pytest.approx(0.25),
        "val/teacher_reward/add": 1.0,
        "val/teacher_reward/mul": 0.0,
        "val/teacher_samples/add": 2.0,
        "val/teacher_samples/mul": 2.0,
    }
    assert metrics["val/reward"] == 0.5 and metrics["val/samples"] == 4
    # one request per teacher for the whole validation, each sequence the prompt and the student's completion
    bos = (TOKENIZER.BOS,)
    for alias, teacher in teachers.items():
        rows = [(problem, completion) for problem, _, routed, completion in ROWS if (routed or "mul") == alias]
        expected = {(*bos, *TOKENIZER.encode(problem), *TOKENIZER.encode(completion)) for problem, completion in rows}
        assert len(teacher.requests) == 1 and set(teacher.requests[0]) == expected


class ActorDiedError(RuntimeError):
    """Named as Ray's: a dead teacher actor."""


def test_a_teacher_failing_in_validation_fails_it_naming_the_step_and_the_teacher(tmp_path: Path) -> None:
    teachers = {"add": ConstantTeacher(-1.0, ActorDiedError("the actor died")), "mul": ConstantTeacher(-1.0)}
    with pytest.raises(
        ValidationError,
        match=r"step 0: the validation's teacher scoring failed: prompt .* \(group validation of step 0, engine "
        r"teacher add\): ActorDiedError: the actor died",
    ):
        validate_once(tmp_path, teachers)


def test_a_validation_row_naming_an_unknown_teacher_fails_at_start_naming_the_row(tmp_path: Path) -> None:
    rows = [*ROWS, ("4+4=", "8", "sub", "8")]
    with pytest.raises(
        UnroutedPromptError,
        match=r"\(dataset row 4\): its 'teacher' field names teacher 'sub', which on_policy_distillation.teachers does "
        r"not have \(known: add, mul\)",
    ):
        distill_controller(tmp_path, {"add": ConstantTeacher(-1.0), "mul": ConstantTeacher(-1.0)}, rows)
