"""The worked-arithmetic task: its dataset's long-tailed answer lengths, and the verifier that checks the work."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.config.runtime import DataConfig, EnvConfig
from sc_lightning.rollout.dataset_base import DatasetError
from sc_lightning.rollout.datasets import WorkedArithmeticDataset, build_dataset
from sc_lightning.rollout.envs import (
    RewardError,
    WholeSolutionEnvironment,
    WorkedArithmeticEnvironment,
    answer_extractor,
    build_environment,
)
from sc_lightning.tasks.worked_arithmetic import WorkedProblem, credit, draw_problems, parse_prompt
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import Prompt

ENV = WorkedArithmeticEnvironment()
EXACT = WholeSolutionEnvironment()


def answer_tokens(prompt: Prompt) -> int:
    """The tokens a right completion of ``prompt`` has with the character tokenizer: the solution and the eos."""
    return len(CharTokenizer().encode(parse_prompt(prompt.text).solution)) + 1


def worked_prompt(a: int, b: int, answer: str | None = None) -> Prompt:
    problem = WorkedProblem(a, b)
    return Prompt("worked_arithmetic-000001", (2,), text=problem.prompt, answer=answer or problem.answer)


def test_the_answers_span_64_to_2048_tokens_with_a_long_tail() -> None:
    """Most answers are short, a few very long: the median near 125 tokens, the mean well above it, and the tail
    reaching past 1,800 of the 2,048 tokens a completion may have."""
    dataset = build_dataset(DataConfig(dataset_name="worked_arithmetic"), CharTokenizer(), seed=7)
    lengths = sorted(answer_tokens(prompt) for prompt in dataset)
    share_over = {limit: sum(n > limit for n in lengths) / len(lengths) for limit in (500, 1000)}
    assert len(lengths) == 4096 and 65 <= lengths[0] <= 70 and 1800 <= lengths[-1] <= 2048, (lengths[0], lengths[-1])
    assert 100 <= statistics.median(lengths) <= 160, statistics.median(lengths)
    assert statistics.mean(lengths) >= 1.5 * statistics.median(lengths)  # the tail pulls the mean up
    assert 0.06 <= share_over[500] <= 0.15 and 0.02 <= share_over[1000] <= 0.06, share_over
    assert lengths[int(0.99 * len(lengths))] >= 8 * statistics.median(lengths)


def test_the_dataset_holds_short_prompts_whose_answers_are_their_remainders() -> None:
    dataset = WorkedArithmeticDataset(64, seed=3, tokenizer=CharTokenizer(), max_prompt_length=8)
    first = dataset[0]
    problem = parse_prompt(first.text)
    assert first.prompt_id == "worked_arithmetic-000000" and first.task == "worked_arithmetic" and first.index == 0
    assert len(first.token_ids) == 8 and first.token_ids[0] == CharTokenizer.BOS
    assert [p.text for p in dataset] == [p.prompt for p in draw_problems(64, 3)]  # the seed fixes the problems
    assert first.answer == str(problem.a % problem.b)
    assert all(ENV.score(p, parse_prompt(p.text).solution) == 1.0 for p in dataset)
    with pytest.raises(DatasetError, match="more than data.max_prompt_length=7"):
        WorkedArithmeticDataset(4, seed=3, tokenizer=CharTokenizer(), max_prompt_length=7)


def test_a_problem_is_worked_one_subtraction_a_line_down_to_its_remainder() -> None:
    problem = parse_prompt("0023-7=")
    assert (problem.a, problem.b, problem.prompt) == (23, 7, "0023-7=")
    assert problem.solution == "6100 9000 2000" and problem.answer == "2"
    assert WorkedProblem(1000, 3).lines[:2] == ["7990", "4990"]  # a borrow through the zeros
    assert WorkedProblem(14, 7).lines == ["7000", "0000"]  # an exact division ends at 0
    for bad in ("23-7=", "0023-1=", "0023+7=", "0023-7"):
        with pytest.raises(ValueError, match="no worked-arithmetic prompt"):
            parse_prompt(bad)
    with pytest.raises(ValueError, match="b <= a"):
        WorkedProblem(5, 7)


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("6100 9000 2000", 1.0),
        (" 6100  9000 2000 ", 1.0),  # whitespace between the lines does not matter
        ("6100 9000 3000", 2 / 3),  # the last line is the answer: a wrong one loses its share
        ("6100 9000", 2 / 3),  # stopped early: its last line is no answer
        ("6100 9000 2000 0000", 2 / 4),  # went on past the answer: as if the last line slipped, over 4 lines
        ("6100 9000 2000 0000 " + "9999 " * 6, 2 / 10),  # every line past the answer dilutes the credit
        ("6100 8000 " + "9999 " * 8, 1 / 10),  # a slip, then rambling on
        ("2000", 0.0),  # the right answer without the work
        ("6100 8000 2000", 1 / 3),  # a wrong step: nothing after it counts, the right last line included
        ("5100 9000 2000", 0.0),
        ("0016 0009 0002", 0.0),  # the digits are written units first
        ("16 9 2", 0.0),  # the lines are 4 digits
        ("", 0.0),
    ],
)
def test_the_verifier_credits_the_lines_before_the_first_slip(completion: str, reward: float) -> None:
    assert ENV.score(worked_prompt(23, 7), completion) == pytest.approx(reward)
    assert EXACT.score(worked_prompt(23, 7), completion) == (1.0 if reward == 1.0 else 0.0)  # all or nothing


@given(st.integers(2, 9), st.integers(0, 400), st.integers(0, 9), st.data())
def test_credit_is_the_share_of_lines_up_to_a_slip_and_1_only_for_the_solution(
    b: int, lines: int, rest: int, data: st.DataObject
) -> None:
    """Any slip at line ``k`` (a wrong line, or the end) earns exactly ``k / n``, or ``k`` over the completion's
    lines when it rambles on past ``n``; only the whole solution earns 1."""
    problem = WorkedProblem(b * (lines + 1) + rest % b, b)
    solution = problem.lines
    slip = data.draw(st.integers(0, len(solution) - 1))
    wrong = data.draw(st.sampled_from(["", "9999", "x", solution[slip][::-1] + "0"]))
    rambling = data.draw(st.integers(0, 500)) if wrong else 0
    written = solution[:slip] + ([wrong] if wrong else []) + ["1000"] * rambling
    assert credit(problem, " ".join(written)) == pytest.approx(slip / max(len(solution), len(written)))
    assert credit(problem, problem.solution) == 1.0


def test_the_verifier_reads_the_last_line_and_refuses_prompts_it_cannot_check() -> None:
    assert answer_extractor(ENV)("6100 9000 2000") == "0002" and ENV.extract_answer("  ") is None
    assert isinstance(build_environment(EnvConfig(name="worked_arithmetic")), WorkedArithmeticEnvironment)
    assert isinstance(build_environment(EnvConfig(name="worked_arithmetic_exact")), WholeSolutionEnvironment)
    assert EXACT.extract_answer("6100 9000 2000") == "0002"
    with pytest.raises(RewardError, match="is not '0023-7='"):
        ENV.score(worked_prompt(23, 7, answer="3"), "6100 9000 3000")
    with pytest.raises(RewardError, match="worked_arithmetic-000001: '2\\+3=' is no worked-arithmetic prompt"):
        ENV.score(dataclasses.replace(worked_prompt(23, 7), text="2+3="), "5")
    with pytest.raises(RewardError, match="must be an integer"):
        ENV.check_answer("2000 0001")
    with pytest.raises(RewardError, match="is not '0023-7='"):
        EXACT.score(worked_prompt(23, 7, answer="3"), "6100 9000 3000")  # all or nothing checks its prompts too
