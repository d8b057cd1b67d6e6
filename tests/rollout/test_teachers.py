"""Teacher scoring for on-policy distillation: routing by the dataset field (errors naming the row and the knob), a
real teacher model's logprobs on the model's tokens only, the tokenizer check at start, and failures classified and
timed like an engine's."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from sc_lightning.config.distillation import DistillationConfig, TeacherConfig
from sc_lightning.models.logprobs import token_logprobs
from sc_lightning.models.teacher import TeacherMismatchError, TeacherModel
from sc_lightning.rollout.failures import classify
from sc_lightning.rollout.manager import RolloutTimeout
from sc_lightning.rollout.teachers import TeacherError, TeacherScoring, UnroutedPromptError, check_routes, route
from sc_lightning.tokenizer import CharImageTokenizer, CharTokenizer
from sc_lightning.types import Generation, Prompt, ScoredGroup

TOK = CharTokenizer()
TEACHERS = {"add": TeacherConfig(model_name="builtin:tiny"), "mul": TeacherConfig(model_name="builtin:tiny")}


def prompt(text: str, index: int, **extra: str) -> Prompt:
    """A dataset prompt ``text`` at row ``index`` with ``extra`` columns."""
    return Prompt(f"p{index}", (TOK.BOS, *TOK.encode(text)), text, index=index, extra=extra)


def test_a_prompt_goes_to_the_teacher_its_field_names_or_the_default() -> None:
    config = DistillationConfig(teachers=TEACHERS, default_teacher="mul")
    assert route(prompt("1+2=", 0, teacher="add"), config) == "add"
    assert route(prompt("3*4=", 1), config) == "mul"  # no field: the default teacher
    prompts = [prompt("1+2=", 0, teacher="add"), prompt("3*4=", 1), prompt("5*6=", 2, teacher="mul")]
    assert check_routes(prompts, config) == {"add": 1, "mul": 2}


def test_an_unknown_alias_names_the_row_and_the_knob() -> None:
    config = DistillationConfig(teachers=TEACHERS)
    with pytest.raises(
        UnroutedPromptError,
        match=r"prompt p7 \(dataset row 7\): its 'teacher' field names teacher "
        r"'sub', which on_policy_distillation.teachers does not have \(known: add, mul\)",
    ):
        check_routes([prompt("1+2=", 0, teacher="add"), prompt("9-1=", 7, teacher="sub")], config)
    with pytest.raises(
        UnroutedPromptError,
        match=r"prompt p3 \(dataset row 3\) has no 'teacher' field and "
        r"on_policy_distillation.default_teacher is null",
    ):
        route(prompt("1+2=", 3), config)


def test_a_teacher_with_another_tokenizer_fails_at_start_naming_it_and_the_knob() -> None:
    with pytest.raises(
        TeacherMismatchError,
        match=r"teacher 'add' \(on_policy_distillation.teachers.add.model_name="
        r"'builtin:tiny'\) has the tokenizer CharTokenizer\(\), not the policy's CharImageTokenizer",
    ):
        TeacherModel("add", "builtin:tiny", policy_tokenizer=CharImageTokenizer())


def test_full_vocabulary_refuses_a_vocabulary_over_its_limit() -> None:
    with pytest.raises(TeacherMismatchError, match="over on_policy_distillation.max_full_vocabulary_size=8"):
        TeacherModel("add", "builtin:tiny", policy_tokenizer=TOK, full_vocabulary=True, max_full_vocabulary_size=8)


def group(text: str, **extra: str) -> ScoredGroup:
    """A scored group of two generations of ``text``: a single-turn one and a two-turn one (its environment tokens
    ``"=3"`` in the middle: trainable False)."""
    first = Generation(tuple(TOK.encode("3")) + (TOK.EOS,), (-0.5, -0.1), "stop", 0)
    turns = tuple(TOK.encode("1+2=3 3"))
    second = Generation(turns, (-0.2,) * len(turns), "stop", 0, trainable=(True,) * 4 + (False,) * 2 + (True,))
    return ScoredGroup(prompt(text, 0, **extra), (first, second), (1.0, 0.0))


def test_a_real_teacher_scores_the_model_tokens_only() -> None:
    config = DistillationConfig(teachers=TEACHERS)
    teacher = TeacherModel("mul", "builtin:tiny", policy_tokenizer=TOK, seed=3)
    scoring = TeacherScoring(config, {"add": teacher, "mul": teacher})
    scored = asyncio.run(scoring(group("1*3=", teacher="mul"), "g0"))
    assert scored.teacher is not None and scored.teacher.alias == "mul" and scored.teacher.index == 1
    prompt_length = len(scored.prompt.token_ids)
    for generation, row in zip(scored.generations, scored.teacher.logprobs, strict=True):
        ids = torch.tensor([[*scored.prompt.token_ids, *generation.token_ids]])
        with torch.no_grad():
            expected = token_logprobs(teacher.model, ids)[0]
        keep = torch.tensor([False] * prompt_length + list(generation.trainable))
        torch.testing.assert_close(row[keep], expected[keep])
        assert (row[~keep] == 0).all() and (row[keep] < 0).all()  # prompt and environment tokens: 0
    time = scoring.snapshot()["mul"]
    assert time.scored_rows == 2 and time.scored_tokens == 7 and time.busy_s > 0
    assert scoring.snapshot()["add"].scored_rows == 0


class FailingTeacher:
    """A teacher that fails as ``error`` says (an injected failure), or never answers (``error`` None)."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    async def score(self, sequences: Sequence[Sequence[int]], *, temperature: float) -> list[torch.Tensor]:
        """Raise the failure, or wait until cancelled."""
        if self.error is None:
            await asyncio.Event().wait()
        raise self.error

    async def shutdown(self) -> None:
        """Nothing to release."""


class ActorDiedError(RuntimeError):
    """Named as Ray's: a dead teacher actor."""


@pytest.mark.parametrize(
    ("error", "kind"), [(ActorDiedError("actor gone"), "infra"), (ValueError("bad ids"), "data"), (None, "infra")]
)
def test_teacher_failures_are_classified_like_the_engines(error: BaseException | None, kind: str) -> None:
    config = DistillationConfig(teachers=TEACHERS, teacher_timeout_s=0.05)
    scoring = TeacherScoring(config, {"add": FailingTeacher(error), "mul": FailingTeacher(error)})
    with pytest.raises((TeacherError, RolloutTimeout)) as failure:
        asyncio.run(scoring(group("1+2=", teacher="add"), "g5"))
    assert classify(failure.value) == kind
    assert "prompt p0 (group g5, engine teacher add)" in str(failure.value)
    if error is None:
        assert "on_policy_distillation.teacher_timeout_s=0.05" in str(failure.value)


class GatedTeacher:
    """FAKE teacher: minus a sequence's length at each of its positions (so a row says whose it is); its first
    request waits for ``gate``; records each request's size."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.requests: list[int] = []

    async def score(self, sequences: Sequence[Sequence[int]], *, temperature: float) -> list[torch.Tensor]:
        """Minus each sequence's length at each position, once the gate is open."""
        self.requests.append(len(sequences))
        await self.gate.wait()
        return [torch.full((len(ids),), -float(len(ids))) for ids in sequences]

    async def shutdown(self) -> None:
        """Nothing to release."""


def test_groups_that_wait_for_a_busy_teacher_share_its_next_forward() -> None:
    """While the teacher scores one group, two more arrive: both go in its next forward, one request of 4 rows."""
    teacher = GatedTeacher()
    scoring = TeacherScoring(DistillationConfig(teachers=TEACHERS), {"add": teacher, "mul": teacher})

    async def scenario() -> list[ScoredGroup]:
        first = asyncio.create_task(scoring(group("1+2=", teacher="add"), "g0"))
        while not teacher.requests:  # the first forward has started
            await asyncio.sleep(0)
        rest = [asyncio.create_task(scoring(group(f"{k}+1=", teacher="add"), f"g{k}")) for k in (1, 2)]
        await asyncio.sleep(0)  # one turn of the loop: the two new tasks run up to their wait in the queue
        teacher.gate.set()
        return await asyncio.gather(first, *rest)

    scored = asyncio.run(scenario())
    assert teacher.requests == [2, 4]
    assert [s.prompt.text for s in scored] == ["1+2=", "1+1=", "2+1="]
    for s in scored:  # each group got its own rows back
        assert s.teacher is not None
        for generation, row in zip(s.generations, s.teacher.logprobs, strict=True):
            length = len(s.prompt.token_ids) + len(generation.token_ids)
            assert row[len(s.prompt.token_ids) :][list(generation.trainable)].eq(-length).all()
    assert scoring.snapshot()["add"].scored_rows == 6


def test_a_group_whose_rollout_gave_up_while_queued_is_not_scored() -> None:
    """A group cancelled while it waits for the busy teacher (its rollout was aborted) costs no forward."""
    teacher = GatedTeacher()
    scoring = TeacherScoring(DistillationConfig(teachers=TEACHERS), {"add": teacher, "mul": teacher})

    async def scenario() -> None:
        first = asyncio.create_task(scoring(group("1+2=", teacher="add"), "g0"))
        while not teacher.requests:  # the first forward has started
            await asyncio.sleep(0)
        queued = asyncio.create_task(scoring(group("2+1=", teacher="add"), "g1"))
        await asyncio.sleep(0)  # one turn of the loop: the new task runs up to its wait in the queue
        queued.cancel()
        teacher.gate.set()
        await first
        with pytest.raises(asyncio.CancelledError):
            await queued

    asyncio.run(scenario())
    assert teacher.requests == [2]
    assert scoring.snapshot()["add"].scored_rows == 2
