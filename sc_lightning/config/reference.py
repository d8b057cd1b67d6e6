"""Render ``docs/config-reference.md`` from the schema, so the reference can never drift from the code.

Run ``python -m sc_lightning.config.reference > docs/config-reference.md``; a test fails when the file is stale.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from sc_lightning.config.knobs import discriminated_choices, field_types, is_section, type_name
from sc_lightning.config.rules_algo import ALGORITHM_RULES
from sc_lightning.config.rules_runtime import RUNTIME_RULES
from sc_lightning.config.schema import SCConfig

_HEADER = """\
# Config reference

Every knob of an sc_lightning config, by dotpath. Generated from `sc_lightning/config/` by
`python -m sc_lightning.config.reference > docs/config-reference.md`; do not edit by hand.

A config is one YAML file (or several, merged in order) with these top-level sections plus Lightning's
`trainer:` and `seed_everything:`. Unknown keys are errors that name the closest known key. `null` knobs
take the derived default their meaning states. Cross-field rules are listed at the end; every violated rule
is reported at once, naming the dotpaths, values and fix.

Every knob has an effect: `tests/config/test_silent_knobs.py` fails for a knob that nothing outside
`sc_lightning/config/` reads, unless it is listed there with the reason only validation or migration reads it.
"""


def render_reference() -> str:
    """The whole reference as Markdown."""
    parts = [_HEADER]
    for fld in dataclasses.fields(SCConfig):
        parts.append(_render_section(fld.name, field_types(SCConfig)[fld.name], fld.metadata.get("doc", "")))
    parts.append(_render_rules())
    return "\n".join(parts)


def _render_section(path: str, tp: Any, doc: str) -> str:
    lines = [f"## `{path}`\n", f"{doc}\n"]
    for variant_name, cls in _section_classes(tp):
        if variant_name:
            lines.append(f"### `{path}` with `name: {variant_name}`\n\n{(cls.__doc__ or '').strip()}\n")
        lines.extend(_table(path, cls))
    return "\n".join(lines)


def _section_classes(tp: Any) -> list[tuple[str | None, type]]:
    choices = discriminated_choices(tp)
    if choices:
        return list(choices.items())
    members = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return [(None, m) for m in members if is_section(m)]


def _table(path: str, cls: type) -> list[str]:
    rows = ["| knob | type | default | unit | meaning | rules |", "|---|---|---|---|---|---|"]
    nested = []
    for fld in dataclasses.fields(cls):
        tp = field_types(cls)[fld.name]
        dotpath = f"{path}.{fld.name}"
        if _section_classes(tp) and not _is_scalar_union(tp):
            nested.append(_render_section(dotpath, tp, fld.metadata.get("doc", "")))
            continue
        rows.append(
            f"| `{dotpath}` | {_escape(type_name(tp))} | {_default_text(fld)} | {fld.metadata.get('unit') or ''} | "
            f"{_meaning(fld)} | {_rules_tying(dotpath)} |"
        )
    return [*rows, "", *nested]


def _is_scalar_union(tp: Any) -> bool:
    return not any(is_section(a) for a in typing.get_args(tp)) and not is_section(tp)


def _meaning(fld: dataclasses.Field) -> str:
    bounds = [
        f"{sign} {fld.metadata[k]:g}"
        for k, sign in (("ge", ">="), ("gt", ">"), ("le", "<="))
        if fld.metadata.get(k) is not None
    ]
    suffix = f" ({', '.join(bounds)})" if bounds else ""
    return _escape(f"{fld.metadata.get('doc', '')}{suffix}")


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _default_text(fld: dataclasses.Field) -> str:
    if fld.default is not dataclasses.MISSING:
        value = fld.default
    elif fld.default_factory is not dataclasses.MISSING:
        value = fld.default_factory()
    else:
        return "required"
    if value is None:
        return "`null`"
    if isinstance(value, tuple | list | dict) and not value:
        return "`[]`" if not isinstance(value, dict) else "`{}`"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


RULES = (*ALGORITHM_RULES, *RUNTIME_RULES)


def rule_ties(rule: object) -> list[str]:
    """The dotpaths a rule ties together, with ``{algo}`` expanded to both algorithm blocks."""
    paths = []
    for path in getattr(rule, "ties", ()):
        paths.extend([path.format(algo="grpo"), path.format(algo="ppo")] if "{algo}" in path else [path])
    return paths


def _rules_tying(dotpath: str) -> str:
    names = [rule.__name__ for rule in RULES if dotpath in rule_ties(rule)]
    return ", ".join(f"[{name}](#{name})" for name in names)


def _render_rules() -> str:
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
