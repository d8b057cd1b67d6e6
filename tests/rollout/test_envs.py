"""Environments: arithmetic exact match, math-verify answers, the answers they read, and build_environment."""

from __future__ import annotations

import re
import threading

import pytest

from sc_lightning.config.runtime import EnvConfig
from sc_lightning.rollout.envs import (
    ArithmeticEnvironment,
    Environment,
    ExternalRewards,
    MathEnvironment,
    RewardError,
    Score,
    answer_check,
    answer_extractor,
    as_score,
    build_environment,
)
from sc_lightning.rollout.envs.math import last_boxed_content
from sc_lightning.types import Prompt


def prompt(answer: str | None, text: str = "") -> Prompt:
    return Prompt(prompt_id="p-000001", token_ids=(2,), text=text, answer=answer)


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("12", 1.0),
        (" 12", 1.0),
        ("12 ", 1.0),
        ("  12=3", 1.0),
        ("12\ufffd", 1.0),
        ("+12", 1.0),
        ("123", 0.0),
        ("1 2", 0.0),
        ("13", 0.0),
        ("-12", 0.0),
        ("", 0.0),
        ("   ", 0.0),
        ("=12", 0.0),
        ("--12", 0.0),
        ("+", 0.0),
        ("\ufffd12", 0.0),
    ],
)
def test_arithmetic_scores_the_leading_integer(completion: str, reward: float) -> None:
    assert ArithmeticEnvironment().score(prompt("12", "7+5="), completion) == reward


def test_arithmetic_zero_and_negative_answers() -> None:
    env = ArithmeticEnvironment()
    assert env.score(prompt("0"), "0") == 1.0
    assert env.score(prompt("0"), "-0") == 1.0
    assert env.score(prompt("0"), "00") == 1.0
    assert env.score(prompt("-3"), "-3") == 1.0
    assert env.score(prompt("-3"), "3") == 0.0


@pytest.mark.parametrize("answer", [None, "twelve", ""])
def test_arithmetic_bad_prompt_is_a_reward_error(answer: str | None) -> None:
    with pytest.raises(RewardError, match="p-000001"):
        ArithmeticEnvironment().score(prompt(answer), "12")


@pytest.mark.parametrize(
    ("answer", "completion"),
    [
        ("0.5", r"So the result is $\boxed{\frac{1}{2}}$."),
        (r"\frac{1}{2}", "0.5"),
        ("12", "The answer is 12."),
        ("2", r"first \boxed{1}, finally \boxed{2}"),
        (r"\sqrt{2}", r"\boxed{\sqrt 2}"),
        ("x^2+1", r"$x^2+1$"),
        (r"\pi/2", r"\boxed{\dfrac{\pi}{2}}"),
        ("(1, 2)", r"\boxed{(1,2)}"),
        ("7", r"\boxed{\boxed{7}}"),
    ],
)
def test_math_accepts_equal_answers(answer: str, completion: str) -> None:
    assert MathEnvironment().score(prompt(answer), completion) == 1.0


@pytest.mark.parametrize(
    ("answer", "completion"),
    [
        ("0.5", r"\boxed{\frac{1}{3}}"),
        ("1", r"first \boxed{1}, finally \boxed{2}"),
        ("3", ""),
        ("3", "garbage }}{{\\"),
        ("3", "\\boxed{"),
        ("3", "\\frac{\\frac{"),
        ("3", "\x00\ufffd" * 50),
        ("3", "}" * 1000 + "\\boxed{" * 300),
        ("5", r"\boxed{5"),
    ],
)
def test_math_rejects_wrong_or_garbage_answers_without_raising(answer: str, completion: str) -> None:
    assert MathEnvironment().score(prompt(answer), completion) == 0.0


@pytest.mark.parametrize("answer", [None, "", "   "])
def test_math_prompt_without_answer_is_a_reward_error(answer: str | None) -> None:
    with pytest.raises(RewardError, match="p-000001"):
        MathEnvironment().score(prompt(answer), r"\boxed{1}")


def test_math_scores_in_worker_threads() -> None:
    env = MathEnvironment()
    results: list[float] = []

    def work() -> None:
        results.append(env.score(prompt("0.5"), r"\boxed{\frac{1}{2}}"))
        results.append(env.score(prompt("0.5"), "nonsense"))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0.0] * 3 + [1.0] * 3


def test_last_boxed_content() -> None:
    assert last_boxed_content(r"a \boxed{1} b \boxed{\frac{1}{2}} c") == r"\frac{1}{2}"
    assert last_boxed_content(r"\fbox{3}") == "3"
    assert last_boxed_content("no box") is None
    assert last_boxed_content(r"\boxed{unclosed {") is None


@pytest.mark.parametrize(("name", "cls"), [("arithmetic", ArithmeticEnvironment), ("math", MathEnvironment)])
def test_build_environment(name: str, cls: type) -> None:
    env = build_environment(EnvConfig(name=name))
    assert isinstance(env, cls)
    assert isinstance(env, Environment)
    assert env.name == name


def test_build_environment_unknown_name_lists_known_ones() -> None:
    with pytest.raises(RewardError, match=r"'nope'.*arithmetic, clevr, external, fixed_length, math"):
        build_environment(EnvConfig(name="nope"))


class NotAnEnvironment:
    """Has a name but no score method."""

    name = "broken"


def test_a_custom_environment_class_path_builds_it() -> None:
    env = build_environment(EnvConfig(name="sc_lightning.rollout.envs.arithmetic:ArithmeticEnvironment"))
    assert isinstance(env, ArithmeticEnvironment)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("tests.rollout.test_envs:NotAnEnvironment", r"is not an Environment: it needs a name and a score\(\) method"),
        ("no_such_module:Env", r"env.name 'no_such_module:Env': cannot import module 'no_such_module'"),
        ("tests.rollout.test_envs:missing", r"'missing' in module 'tests.rollout.test_envs' is not a class"),
    ],
)
def test_a_bad_custom_environment_names_env_name_and_what_is_wrong(name: str, message: str) -> None:
    with pytest.raises(RewardError, match=message):
        build_environment(EnvConfig(name=name))


@pytest.mark.parametrize("verdict", ["1.0", None, [1.0]])
def test_a_reward_that_is_not_a_number_is_a_reward_error_naming_it(verdict: object) -> None:
    with pytest.raises(RewardError, match=rf"returned {re.escape(repr(verdict))} \({type(verdict).__name__}\)"):
        as_score(verdict)
    assert as_score(True).reward == 1.0 and as_score(Score(0.5, mask_sample=True)).mask_sample


def test_the_external_environment_refuses_to_score_naming_the_reward_route() -> None:
    environment = build_environment(EnvConfig(name="external"))
    with pytest.raises(RewardError, match=r"prompt p1: env.name external .*/v1/rollouts/\{rollout_id\}/reward"):
        environment.score(Prompt("p1", (2,), text="1+1="), "2")


def test_environments_that_verify_answers_check_them_alone() -> None:
    """The arithmetic and calculator verifiers need an integer, math-verify a parseable answer; external rewards have
    no answer to check."""
    from sc_lightning.rollout.multiturn.calculator import CalculatorEnvironment

    for env in (ArithmeticEnvironment(), CalculatorEnvironment()):
        check = answer_check(env)
        assert check is not None
        check(" 12 ")
        with pytest.raises(RewardError, match=r"must be an integer, got '7\.5'"):
            check("7.5")
    math_check = answer_check(MathEnvironment())
    assert math_check is not None
    math_check(r"\frac{1}{2}")
    with pytest.raises(RewardError, match="needs an answer"):
        math_check(" ")
    assert answer_check(ExternalRewards()) is None


@pytest.mark.parametrize(("completion", "read"), [(" 12=3", "12"), ("-4 ", "-4"), ("123", "123"), ("x1", None)])
def test_arithmetic_reads_the_leading_integer_it_scores(completion: str, read: str | None) -> None:
    extract = answer_extractor(ArithmeticEnvironment())
    assert extract is not None and extract(completion) == read
    scored = ArithmeticEnvironment().score(prompt("12"), completion)
    assert scored == (1.0 if read == "12" else 0.0)


def test_math_reads_the_last_box_else_what_math_verify_extracts() -> None:
    extract = answer_extractor(MathEnvironment())
    assert extract is not None
    assert extract(r"first \boxed{1}, then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract("The answer is 42.") == "42"
    assert extract("nothing here") is None
    assert answer_extractor(ExternalRewards()) is None  # agents post the rewards: no answer is read
