"""The config reference, generated from the schema so it can never drift from the code.

One model of every section, knob and cross-field rule (:func:`reference_sections`,
:data:`~sc_lightning.config.rules.RULES`), rendered two ways: as ``docs/config-reference.md``
(``python -m sc_lightning.config.reference > docs/config-reference.md``; a test fails when the file is stale) and as
the plain text of ``python -m sc_lightning knobs [SECTION]``.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from sc_lightning.config.knobs import discriminated_choices, field_types, is_section, type_name
from sc_lightning.config.rules import RULES
from sc_lightning.config.schema import SCConfig

_HEADER = """\
# Config reference

Every knob of an sc_lightning config, by dotpath. Generated from `sc_lightning/config/` by
`python -m sc_lightning.config.reference > docs/config-reference.md`; do not edit by hand.

A config is one YAML file (or several, merged in order) with these top-level sections plus Lightning's
`trainer:` and `seed_everything:`. Unknown keys are errors that name the closest known key. `null` knobs
take the derived default their meaning states. A section whose `name` picks its kind (`async_rl.sampler`,
`grpo.adv_estimator`) and that leaves `name` out is the default kind with the settings given. Cross-field rules
are listed at the end; every violated rule is reported at once, naming the dotpaths, values and fix.

Every knob has an effect: `tests/config/test_silent_knobs.py` fails for a knob that nothing outside
`sc_lightning/config/` reads, unless it is listed there with the reason only validation or migration reads it.
"""


@dataclass(frozen=True)
class KnobDoc:
    """One knob as the reference documents it: dotpath, type, default, unit, meaning (with bounds), rule names."""

    dotpath: str
    type: str
    default: str  # as YAML writes it: 512, null, [], or "required"
    unit: str
    meaning: str
    rules: tuple[str, ...]


@dataclass(frozen=True)
class VariantDoc:
    """A section's knobs for one ``name:`` (a sampler mode, an estimator), or for the only form (``name`` None)."""

    name: str | None
    doc: str
    knobs: tuple[KnobDoc, ...]
    subsections: tuple[SectionDoc, ...]


@dataclass(frozen=True)
class SectionDoc:
    """A section of the config: its dotpath, its one-line doc and its variants."""

    path: str
    doc: str
    variants: tuple[VariantDoc, ...]


def reference_sections() -> list[SectionDoc]:
    """Every top-level section of a config, in declaration order, subsections inside."""
    return [
        _section(fld.name, field_types(SCConfig)[fld.name], fld.metadata.get("doc", ""))
        for fld in dataclasses.fields(SCConfig)
    ]


def section_summaries() -> list[tuple[str, str]]:
    """Each top-level section's name and one-line doc (what ``fit --help`` lists)."""
    return [(fld.name, fld.metadata.get("doc", "")) for fld in dataclasses.fields(SCConfig)]


def rule_ties(rule: object) -> list[str]:
    """The dotpaths a rule ties together, with ``{algo}`` expanded to both algorithm blocks."""
    paths = []
    for path in getattr(rule, "ties", ()):
        paths.extend([path.format(algo="grpo"), path.format(algo="ppo")] if "{algo}" in path else [path])
    return paths


def _section(path: str, tp: Any, doc: str) -> SectionDoc:
    variants = []
    for name, cls in _section_classes(tp):
        knobs, subsections = [], []
        for fld in dataclasses.fields(cls):
            field_tp, dotpath = field_types(cls)[fld.name], f"{path}.{fld.name}"
            if _section_classes(field_tp) and not _is_scalar_union(field_tp):
                subsections.append(_section(dotpath, field_tp, fld.metadata.get("doc", "")))
            else:
                knobs.append(_knob(dotpath, field_tp, fld))
        variants.append(VariantDoc(name, (cls.__doc__ or "").strip(), tuple(knobs), tuple(subsections)))
    return SectionDoc(path, doc, tuple(variants))


def _section_classes(tp: Any) -> list[tuple[str | None, type]]:
    choices = discriminated_choices(tp)
    if choices:
        return list(choices.items())
    members = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return [(None, m) for m in members if is_section(m)]


def _is_scalar_union(tp: Any) -> bool:
    return not any(is_section(a) for a in typing.get_args(tp)) and not is_section(tp)


def _knob(dotpath: str, tp: Any, fld: dataclasses.Field) -> KnobDoc:
    bounds = [
        f"{sign} {fld.metadata[k]:g}"
        for k, sign in (("ge", ">="), ("gt", ">"), ("le", "<="))
        if fld.metadata.get(k) is not None
    ]
    suffix = f" ({', '.join(bounds)})" if bounds else ""
    rules = tuple(rule.__name__ for rule in RULES if dotpath in rule_ties(rule))
    return KnobDoc(
        dotpath,
        type_name(tp),
        _default_text(fld),
        fld.metadata.get("unit") or "",
        fld.metadata.get("doc", "") + suffix,
        rules,
    )


def _default_text(fld: dataclasses.Field) -> str:
    if fld.default is not dataclasses.MISSING:
        value = fld.default
    elif fld.default_factory is not dataclasses.MISSING:
        value = fld.default_factory()
    else:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, tuple | list):  # as YAML writes a list: [count, colour]
        return f"[{', '.join(str(item) for item in value)}]"
    if isinstance(value, dict) and not value:
        return "{}"
    return str(value).lower() if isinstance(value, bool) else str(value)


# --- Markdown: docs/config-reference.md -------------------------------------------------------------------------


def render_reference() -> str:
    """The whole reference as Markdown."""
    parts = [_HEADER, *(_markdown_section(section) for section in reference_sections()), _markdown_rules()]
    return "\n".join(parts)


def _markdown_section(section: SectionDoc) -> str:
    lines = [f"## `{section.path}`\n", f"{section.doc}\n"]
    for variant in section.variants:
        if variant.name:
            lines.append(f"### `{section.path}` with `name: {variant.name}`\n\n{variant.doc}\n")
        lines += ["| knob | type | default | unit | meaning | rules |", "|---|---|---|---|---|---|"]
        lines += [_markdown_row(knob) for knob in variant.knobs]
        lines += ["", *(_markdown_section(sub) for sub in variant.subsections)]
    return "\n".join(lines)


def _markdown_row(knob: KnobDoc) -> str:
    default = knob.default if knob.default == "required" else f"`{knob.default}`"
    rules = ", ".join(f"[{name}](#{name})" for name in knob.rules)
    return f"| `{knob.dotpath}` | {_escape(knob.type)} | {default} | {knob.unit} | {_escape(knob.meaning)} | {rules} |"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _markdown_rules() -> str:
    lines = [
        "## Cross-field rules\n",
        "Checked by `validate_single_controller_config` before anything starts (`{algo}` is grpo or ppo).\n",
    ]
    for rule in RULES:
        knobs = ", ".join(f"`{p}`" for p in getattr(rule, "ties", ()))
        lines.append(f"### {rule.__name__}\n\n{(rule.__doc__ or '').strip()} Ties: {knobs}.\n")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_reference(), end="")
