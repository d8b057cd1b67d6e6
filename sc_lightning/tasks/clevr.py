"""A tiny synthetic CLEVR: scenes of coloured shapes rendered at 32x32, and questions about them with one-digit answers.

A scene holds 1 to 3 objects, each a red, green or blue square or circle, in distinct cells of a 2x2 grid (jittered
by up to two pixels) on a grey ground. Its question is one of two kinds, written in the character tokenizer's
alphabet (digits, ``+ - * =``) so the built-in tiny models can read it, with the English question beside it:

==========  =========  ===============================================  ================================
kind        text       English                                          answer
==========  =========  ===============================================  ================================
count       ``+c=``    How many <colour c> objects?                     the count, ``0`` .. ``3``
colour      ``*s=``    What colour is the <shape s>? (one such object)  the colour's code, ``0`` .. ``2``
==========  =========  ===============================================  ================================

Attribute codes: colours ``0`` red, ``1`` green, ``2`` blue; shapes ``3`` square, ``4`` circle. A colour question
names a shape only one object of the scene has. Everything is drawn from a seed: the same seed gives the same
scenes, pixels and questions. The task is sized for the tiny VLM to learn from a few thousand sampled answers
(docs/vlm.md): a relation kind ("is the red object left of the blue one?") stayed at its 0.5 guess after 400
supervised steps of 64 examples, so it is not drawn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

IMAGE_SIZE = 32
"""Side of a rendered scene, in pixels."""
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (50, 80, 230)}
"""Colour name -> RGB; a colour's code is its position (0, 1, 2)."""
SHAPES = ("square", "circle")
"""Shape names; a shape's code is its position plus the number of colours (3, 4)."""
BACKGROUND = (128, 128, 128)
CELL = IMAGE_SIZE // 2
RADIUS = 4
"""Half the side of a square, the radius of a circle."""
JITTER = 2
"""Most pixels an object's centre moves from its cell's centre, each way."""
KINDS = ("count", "colour")


@dataclass(frozen=True)
class SceneObject:
    """One object: its colour and shape names, and its grid cell (0 top-left, 1 top-right, 2 and 3 below)."""

    colour: str
    shape: str
    cell: int
    dx: int = 0
    dy: int = 0

    @property
    def centre(self) -> tuple[int, int]:
        """Its centre's pixel ``(x, y)``."""
        return (self.cell % 2) * CELL + CELL // 2 + self.dx, (self.cell // 2) * CELL + CELL // 2 + self.dy


@dataclass(frozen=True)
class ClevrQuestion:
    """A scene, a question about it (``text`` in codes, ``english`` in words) and its exact answer."""

    objects: tuple[SceneObject, ...]
    kind: str
    text: str
    english: str
    answer: str


def code(attribute: str) -> str:
    """The one-digit code of a colour or shape name."""
    names = [*COLOURS, *SHAPES]
    return str(names.index(attribute))


def render(objects: tuple[SceneObject, ...]) -> np.ndarray:
    """The scene as an RGB uint8 array of ``IMAGE_SIZE x IMAGE_SIZE x 3``."""
    image = np.empty((IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    ys, xs = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]
    for obj in objects:
        x, y = obj.centre
        if obj.shape == "square":
            mask = (np.abs(xs - x) <= RADIUS) & (np.abs(ys - y) <= RADIUS)
        else:
            mask = (xs - x) ** 2 + (ys - y) ** 2 <= (RADIUS + 0.5) ** 2
        image[mask] = COLOURS[obj.colour]
    return image


def draw_scene(rng: random.Random) -> tuple[SceneObject, ...]:
    """1 to 3 objects of random colours and shapes in distinct cells, each jittered."""
    cells = rng.sample(range(4), rng.randint(1, 3))
    return tuple(
        SceneObject(
            rng.choice(list(COLOURS)),
            rng.choice(SHAPES),
            cell,
            rng.randint(-JITTER, JITTER),
            rng.randint(-JITTER, JITTER),
        )
        for cell in sorted(cells)
    )


def ask(objects: tuple[SceneObject, ...], kind: str, rng: random.Random) -> ClevrQuestion | None:
    """A question of ``kind`` about the scene, or None when the scene allows none (no shape only one object has)."""
    if kind == "count":
        colour = rng.choice(list(COLOURS))
        count = sum(obj.colour == colour for obj in objects)
        return ClevrQuestion(objects, kind, f"+{code(colour)}=", f"How many {colour} objects?", str(count))
    unique = [obj for obj in objects if sum(o.shape == obj.shape for o in objects) == 1]
    if not unique:
        return None
    obj = rng.choice(unique)
    return ClevrQuestion(objects, kind, f"*{code(obj.shape)}=", f"What colour is the {obj.shape}?", code(obj.colour))


def draw_questions(count: int, seed: int | str) -> list[ClevrQuestion]:
    """``count`` questions drawn from ``seed``, the kinds in turn, each about a fresh scene (a scene that
    allows no question of its kind is drawn again)."""
    rng = random.Random(f"clevr:{seed}")
    questions: list[ClevrQuestion] = []
    while len(questions) < count:
        question = ask(draw_scene(rng), KINDS[len(questions) % len(KINDS)], rng)
        if question is not None:
            questions.append(question)
    return questions


def first_word(completion: str) -> str | None:
    """The completion's first whitespace-separated word (the answer the task reads), or None when it has none."""
    words = completion.split()
    return words[0] if words else None
