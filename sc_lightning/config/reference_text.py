"""The config reference as plain text for a terminal: ``python -m sc_lightning knobs [SECTION]``.

The same model as ``docs/config-reference.md`` (:mod:`~sc_lightning.config.reference`): each knob's dotpath, type,
default and unit, its meaning, and the cross-field rules that tie it to other knobs, explained after the knobs.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

from sc_lightning.config.knobs import closest
from sc_lightning.config.reference import KnobDoc, SectionDoc, reference_sections
from sc_lightning.config.rules import RULES

_WIDTH = 110
_INDENT = "    "


class UnknownKnobPath(ValueError):
    """``knobs SECTION`` names no section or knob; the message suggests the closest one."""


def render_knobs(selector: str | None = None) -> str:
    """Every knob under ``selector`` (a section such as ``async_rl.sampler``, or one knob's dotpath; None: all).

    Raises :class:`UnknownKnobPath` when nothing matches.
    """
    blocks = []
    for heading, knobs in _blocks(reference_sections()):
        chosen = [knob for knob in knobs if _selected(knob.dotpath, selector)]
        if chosen:
            blocks.append((heading, chosen))
    if not blocks:
        raise UnknownKnobPath(_unknown_message(str(selector)))
    lines: list[str] = []
    for heading, knobs in blocks:
        lines += [*_wrapped(heading, ""), *(line for knob in knobs for line in _knob_lines(knob)), ""]
    return "\n".join(lines + _rule_lines({name for _, knobs in blocks for knob in knobs for name in knob.rules}))


def _blocks(sections: list[SectionDoc]) -> Iterator[tuple[str, tuple[KnobDoc, ...]]]:
    """(heading, knobs) for every section and sampler-style variant, depth first in declaration order."""
    for section in sections:
        for variant in section.variants:
            if variant.name:
                yield f"[{section.path}] with name: {variant.name} — {variant.doc}", variant.knobs
            else:
                yield f"[{section.path}] {section.doc}", variant.knobs
            yield from _blocks(list(variant.subsections))


def _selected(dotpath: str, selector: str | None) -> bool:
    return selector is None or dotpath == selector or dotpath.startswith(f"{selector}.")


def _knob_lines(knob: KnobDoc) -> list[str]:
    unit = f" ({knob.unit})" if knob.unit else ""
    lines = [f"  {knob.dotpath}: {knob.type} = {knob.default}{unit}", *_wrapped(knob.meaning, _INDENT)]
    if knob.rules:
        lines += _wrapped(f"rules: {', '.join(knob.rules)}", _INDENT)
    return lines


def _rule_lines(names: set[str]) -> list[str]:
    if not names:
        return []
    lines = ["Rules tying these knobs to others (checked before anything starts; {algo} is grpo or ppo):"]
    for rule in RULES:
        if rule.__name__ in names:
            ties = ", ".join(getattr(rule, "ties", ()))
            lines += _wrapped(f"{rule.__name__}: {(rule.__doc__ or '').strip()} Ties: {ties}.", "  ")
    return [*lines, ""]


def _wrapped(text: str, indent: str) -> list[str]:
    return textwrap.wrap(
        " ".join(text.split()), _WIDTH, initial_indent=indent, subsequent_indent=indent + "  " if indent else "  "
    )


def _unknown_message(selector: str) -> str:
    paths = sorted({p for h, knobs in _blocks(reference_sections()) for k in knobs for p in _prefixes(k.dotpath)})
    guess = closest(selector, paths)
    hint = f"; did you mean {guess}?" if guess else "; run `python -m sc_lightning knobs` for every knob"
    return f"no config section or knob {selector!r}{hint}"


def _prefixes(dotpath: str) -> list[str]:
    parts = dotpath.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]
