"""The tiny synthetic CLEVR: seeded scenes rendered as drawn, questions whose answers the scene bears out, and the
exact-match verifier (the built-in dataset: test_image_datasets.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sc_lightning.config.runtime import EnvConfig
from sc_lightning.rollout.envs import build_environment
from sc_lightning.rollout.envs.base import RewardError
from sc_lightning.tasks.clevr import BACKGROUND, COLOURS, SHAPES, SceneObject, code, draw_questions, render
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import Prompt


def test_the_same_seed_draws_the_same_questions_and_another_seed_others() -> None:
    assert draw_questions(30, 7) == draw_questions(30, 7)
    assert draw_questions(30, 7) != draw_questions(30, 8)


def test_render_paints_each_object_its_colour_and_shape_on_the_grey_ground() -> None:
    square, circle = SceneObject("red", "square", 0), SceneObject("blue", "circle", 3, dx=1, dy=-2)
    image = render((square, circle))
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    for obj in (square, circle):
        x, y = obj.centre
        assert tuple(image[y, x]) == COLOURS[obj.colour]
        corner = tuple(image[y - 4, x - 4])  # a square fills its corners, a circle does not
        assert corner == (COLOURS[obj.colour] if obj.shape == "square" else BACKGROUND)
    assert tuple(image[0, 31]) == BACKGROUND  # the empty top-right cell


def _recount(question) -> str:  # noqa: ANN001 - a ClevrQuestion
    """The answer of a question worked out again from its scene and its coded text."""
    objects, text = question.objects, question.text
    names = [*COLOURS, *SHAPES]
    if question.kind == "count":
        return str(sum(o.colour == names[int(text[1])] for o in objects))
    (obj,) = [o for o in objects if o.shape == names[int(text[1])]]
    return code(obj.colour)


def test_every_answer_is_one_digit_the_scene_bears_out_and_every_kind_is_asked() -> None:
    questions = draw_questions(300, 0)
    assert {q.kind for q in questions} == {"count", "colour"}
    assert {len(q.objects) for q in questions} == {1, 2, 3}
    assert all(len(q.answer) == 1 and q.answer.isdigit() for q in questions)
    assert all(_recount(q) == q.answer for q in questions)
    assert all(set(q.text) <= set(CharTokenizer.CHARS) for q in questions)  # the tiny tokenizer spells them


def test_the_answers_are_not_one_guess() -> None:
    """No answer is right for more than half of a kind's questions, so a blind policy cannot score well."""
    questions = draw_questions(600, 1)
    for kind in ("count", "colour"):
        answers = [q.answer for q in questions if q.kind == kind]
        assert max(answers.count(a) for a in set(answers)) / len(answers) < 0.55, kind


def test_the_verifier_rewards_the_exact_first_word() -> None:
    env = build_environment(EnvConfig(name="clevr"))
    prompt = Prompt("p", (2,), text="+1=", answer="2")
    assert [env.score(prompt, c) for c in ("2", " 2 more", "23", "", "3")] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert env.extract_answer(" 2 x") == "2" and env.extract_answer(" ") is None
    with pytest.raises(RewardError, match="one word"):
        env.check_answer("2 3")
    with pytest.raises(RewardError, match="prompt q"):
        env.score(Prompt("q", (2,)), "2")
