"""A tiny synthetic CLEVR: scenes of coloured shapes rendered at 32x32, and questions about them with one-digit answers.

A scene holds 1 to 3 objects, each a red, green or blue square or circle, in distinct cells of a 2x2 grid (jittered
by up to two pixels) on a grey ground. Its question is one of three kinds, written in the character tokenizer's
alphabet (digits, ``+ - * =``) so the built-in tiny models can read it, with the English question beside it:

==========  =========  ===============================================  ================================
kind        text       English                                          answer
==========  =========  ===============================================  ================================
count       ``+c=``    How many <colour c> objects?                     the count, ``0`` .. ``3``
colour      ``*s=``    What colour is the <shape s>? (one such object)  the colour's code, ``0`` .. ``2``
relation    ``-arb=``  Is the <colour a> object <relation r> the        ``1`` (yes) or ``0`` (no)
                       <colour b> object?
==========  =========  ===============================================  ================================

Codes: colours ``0`` red, ``1`` green, ``2`` blue; shapes ``3`` square, ``4`` circle; relations ``5`` left of,
``6`` right of, ``7`` above, ``8`` below. A colour question names a shape only one object of the scene has. A relation
question names two colours one object each has, and a relation their grid cells decide: left of and right of for
objects in different columns, above and below for objects in different rows (the jitter never moves an object out of
its cell, so the answer is the cells'). Everything is drawn from a seed: the same seed gives the same scenes, pixels
and questions.

:data:`DEFAULT_KINDS` (count and colour) are what :func:`draw_questions` draws unless asked for others
(``data.clevr_kinds``). The default is sized for the tiny VLM to learn from a few thousand sampled answers
(docs/vlm.md): supervised, ``builtin:tiny-vlm`` answers relation questions at its 0.5 guess for some 2,600 steps of
64 examples before it learns them, far more than the shipped example (configs/grpo_tiny_vlm.yaml) samples, so that
example leaves the kind out and a run asks for it by name.
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
RELATIONS = ("left of", "right of", "above", "below")
"""Relation names; a relation's code is its position plus the number of colours and shapes (5 .. 8)."""
KINDS = ("count", "colour", "relation")
"""Every kind of question the task asks."""
DEFAULT_KINDS = ("count", "colour")
"""The kinds drawn unless others are asked for: those the tiny VLM learns (the relation kind is opt-in)."""


@dataclass(frozen=True)
class SceneObject:
    """One object: its colour and shape names, and its grid cell (0 top-left, 1 top-right, 2 and 3 below)."""

    colour: str
    shape: str
    cell: int
    dx: int = 0
    dy: int = 0

    @property
    def column(self) -> int:
        """Its grid column: 0 left, 1 right."""
        return self.cell % 2

    @property
    def row(self) -> int:
        """Its grid row: 0 top, 1 bottom."""
        return self.cell // 2

    @property
    def centre(self) -> tuple[int, int]:
        """Its centre's pixel ``(x, y)``."""
        return self.column * CELL + CELL // 2 + self.dx, self.row * CELL + CELL // 2 + self.dy


@dataclass(frozen=True)
class ClevrQuestion:
    """A scene, a question about it (``text`` in codes, ``english`` in words) and its exact answer."""

    objects: tuple[SceneObject, ...]
    kind: str
    text: str
    english: str
    answer: str


def code(attribute: str) -> str:
    """The one-digit code of a colour, shape or relation name."""
    names = [*COLOURS, *SHAPES, *RELATIONS]
    return str(names.index(attribute))


def relation_holds(a: SceneObject, relation: str, b: SceneObject) -> bool | None:
    """Whether ``a`` is ``relation`` ``b`` by their grid cells; None when the cells do not decide it (left of and
    right of for objects in one column, above and below for objects in one row)."""
    horizontal = relation in ("left of", "right of")
    where_a, where_b = (a.column, b.column) if horizontal else (a.row, b.row)
    if where_a == where_b:
        return None
    return (where_a < where_b) == (relation in ("left of", "above"))


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


def _count_question(objects: tuple[SceneObject, ...], rng: random.Random) -> ClevrQuestion:
    """How many objects of a random colour (zero included)."""
    colour = rng.choice(list(COLOURS))
    count = sum(obj.colour == colour for obj in objects)
    return ClevrQuestion(objects, "count", f"+{code(colour)}=", f"How many {colour} objects?", str(count))


def _colour_question(objects: tuple[SceneObject, ...], rng: random.Random) -> ClevrQuestion | None:
    """The colour of an object whose shape no other object has; None when there is none."""
    unique = [obj for obj in objects if sum(o.shape == obj.shape for o in objects) == 1]
    if not unique:
        return None
    obj = rng.choice(unique)
    english = f"What colour is the {obj.shape}?"
    return ClevrQuestion(objects, "colour", f"*{code(obj.shape)}=", english, code(obj.colour))


def _relation_question(objects: tuple[SceneObject, ...], rng: random.Random) -> ClevrQuestion | None:
    """Whether one object is left of, right of, above or below another, both of colours no other object has, the
    relation one their cells decide (as many such questions answer yes as no); None when two such objects are
    missing."""
    unique = [obj for obj in objects if sum(o.colour == obj.colour for o in objects) == 1]
    choices = [
        (a, relation, b, holds)
        for a in unique
        for b in unique
        if a is not b
        for relation in RELATIONS
        if (holds := relation_holds(a, relation, b)) is not None
    ]
    if not choices:
        return None
    a, relation, b, holds = rng.choice(choices)
    text = f"-{code(a.colour)}{code(relation)}{code(b.colour)}="
    english = f"Is the {a.colour} object {relation} the {b.colour} object?"
    return ClevrQuestion(objects, "relation", text, english, "1" if holds else "0")


_ASK = {"count": _count_question, "colour": _colour_question, "relation": _relation_question}


def ask(objects: tuple[SceneObject, ...], kind: str, rng: random.Random) -> ClevrQuestion | None:
    """A question of ``kind`` (one of :data:`KINDS`) about the scene, or None when the scene allows none (no shape
    only one object has, for colour; fewer than two objects of colours only they have, for relation)."""
    return _ASK[kind](objects, rng)


def draw_questions(count: int, seed: int | str, kinds: tuple[str, ...] = DEFAULT_KINDS) -> list[ClevrQuestion]:
    """``count`` questions drawn from ``seed``, of ``kinds`` in turn, each about a fresh scene (a scene that allows
    no question of its kind is drawn again); ValueError when ``kinds`` is empty or names a kind not in :data:`KINDS`."""
    unknown = [kind for kind in kinds if kind not in KINDS]
    if not kinds or unknown:
        raise ValueError(f"clevr question kinds must be one or more of {', '.join(KINDS)}, got {list(kinds)}")
    rng = random.Random(f"clevr:{seed}")
    questions: list[ClevrQuestion] = []
    while len(questions) < count:
        question = ask(draw_scene(rng), kinds[len(questions) % len(kinds)], rng)
        if question is not None:
            questions.append(question)
    return questions


def first_word(completion: str) -> str | None:
    """The completion's first whitespace-separated word (the answer the task reads), or None when it has none."""
    words = completion.split()
    return words[0] if words else None
