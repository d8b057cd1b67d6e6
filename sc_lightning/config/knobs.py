"""Typed knobs: how a config section declares its fields, and how raw YAML becomes typed sections.

A section is a frozen dataclass whose fields are declared with :func:`knob`. :func:`build_section` turns a raw
mapping into that dataclass, collecting *every* problem (unknown key with the closest known key, wrong type,
value out of range) as a :class:`ConfigIssue` that names the dotpath, so a user fixes a config in one pass.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

MISSING = dataclasses.MISSING


@dataclass(frozen=True)
class ConfigIssue:
    """One problem with a config: where it is, what is wrong and how to fix it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(ValueError):
    """Raised with every :class:`ConfigIssue` found in a config, so all of them can be fixed at once."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = list(issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        plural = "s" if len(self.issues) != 1 else ""
        super().__init__(f"invalid sc_lightning config ({len(self.issues)} problem{plural}):\n{lines}")


def knob(
    default: Any = MISSING,
    doc: str = "",
    *,
    unit: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    factory: Any = MISSING,
) -> Any:
    """Declare a config field with its one-line meaning, unit and numeric bounds (checked when loading).

    Code outside ``sc_lightning/config/`` must read the new field where it takes effect; the silent-knobs test
    (``tests/config/test_silent_knobs.py``) fails otherwise.
    """
    metadata = {"doc": doc, "unit": unit, "ge": ge, "gt": gt, "le": le}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type) -> type:
    """Make a config section: a frozen, keyword-only dataclass."""
    return dataclass(frozen=True, kw_only=True)(cls)


def is_section(tp: Any) -> bool:
    """Whether ``tp`` is a config section class."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a section's fields, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def discriminated_choices(tp: Any) -> dict[str, type] | None:
    """For a union of sections that each carry a ``name: Literal[...]`` field, map each name to its section."""
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return None
    members = [m for m in typing.get_args(tp) if m is not type(None)]
    if not members or not all(is_section(m) and "name" in field_types(m) for m in members):
        return None
    return {typing.get_args(field_types(m)["name"])[0]: m for m in members}


def _named_as_default(fld: dataclasses.Field, tp: Any, value: Any) -> Any:
    """``value`` for a union of named sections; a mapping without ``name`` gets the name of the field's default (so
    ``adv_estimator: {normalize_rewards: false}`` changes one setting of the default estimator)."""
    if not isinstance(value, Mapping) or "name" in value or discriminated_choices(tp) is None:
        return value
    if fld.default_factory is not MISSING:
        default = fld.default_factory()
    elif fld.default is not MISSING:
        default = fld.default
    else:
        return value
    name = getattr(default, "name", None)
    return value if name is None else {"name": name, **value}


def closest(word: str, candidates: list[str]) -> str | None:
    """The candidate most like ``word``, or None when nothing is close."""
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def type_name(tp: Any) -> str:
    """A type as users read it: 'a' | 'b', int | null, list of str, mapping of float."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin in (list, tuple):
        return f"list of {type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of {type_name(typing.get_args(tp)[1])}"
    if is_section(tp):
        return "mapping"
    return getattr(tp, "__name__", repr(tp))


class _Builder:
    """Walks raw YAML against section types, collecting issues instead of stopping at the first."""

    def __init__(self, index: Mapping[str, list[str]] | None = None) -> None:
        self.issues: list[ConfigIssue] = []
        self.index = index or {}

    def fail(self, path: str, message: str) -> None:
        """Record one issue."""
        self.issues.append(ConfigIssue(path, message))

    def section(self, cls: type, raw: Any, path: str) -> Any:
        """Build section ``cls`` from a raw mapping, or None when any field is bad."""
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            self.fail(path, f"expected a mapping of {cls.__name__} settings, got {type(raw).__name__} {raw!r}")
            return None
        hints = field_types(cls)
        values: dict[str, Any] = {}
        ok = True
        extras_field = getattr(cls, "extra_keys_field", None)
        extras = {k: v for k, v in raw.items() if k not in hints} if extras_field else {}
        for key, value in raw.items():
            if key in extras:
                continue
            if key not in hints:
                self.unknown_key(cls, str(key), path)
                ok = False
                continue
            fld = next(f for f in dataclasses.fields(cls) if f.name == key)
            converted = self.value(
                hints[key], _named_as_default(fld, hints[key], value), _join(path, key), fld.metadata
            )
            if converted is _INVALID:
                ok = False
            else:
                values[key] = converted
        for fld in dataclasses.fields(cls):
            if fld.name not in values and fld.default is MISSING and fld.default_factory is MISSING:
                self.fail(_join(path, fld.name), "is required; set it in the config")
                ok = False
        if extras:
            values[extras_field] = {**values.get(extras_field, {}), **extras}
        return cls(**values) if ok else None

    def unknown_key(self, cls: type, key: str, path: str) -> None:
        """Report a key the section does not have, pointing at the key most likely meant."""
        hint = getattr(cls, "unknown_key_hint", None)
        special = hint(key) if hint else None
        if special:
            self.fail(_join(path, key), special)
            return
        guess = closest(key, list(field_types(cls)))
        elsewhere = [p for p in self.index.get(key, []) if p != _join(path, key)]
        near = closest(key, list(self.index)) if not elsewhere else None
        if guess:
            suffix = f"; did you mean {_join(path, guess)}?"
        elif elsewhere:
            suffix = f"; it belongs at {' or '.join(elsewhere)}"
        elif near:
            suffix = f"; did you mean {' or '.join(self.index[near])}?"
        else:
            suffix = f"; known keys here: {', '.join(field_types(cls))}"
        self.fail(_join(path, key), f"unknown key{suffix}")

    def value(self, tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
        """Convert one value to type ``tp``, or record why it cannot be."""
        choices = discriminated_choices(tp)
        if choices is not None:
            return self.tagged(choices, value, path)
        origin = typing.get_origin(tp)
        if origin in (Union, types.UnionType):
            return self.optional(tp, value, path, meta)
        if origin is Literal:
            return self.literal(tp, value, path)
        if origin in (list, tuple, dict):
            return self.container(tp, value, path)
        if is_section(tp):
            built = self.section(tp, value, path)
            return _INVALID if built is None else built
        return self.scalar(tp, value, path, meta)

    def optional(self, tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
        """``X | None``: None, or the value converted to X (other unions are not knob types)."""
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return self.value(inner[0], value, path, meta)
        return self.mismatch(path, tp, value)

    def literal(self, tp: Any, value: Any, path: str) -> Any:
        """One of a ``Literal``'s options, or an error naming them (and the closest)."""
        options = typing.get_args(tp)
        if value in options:
            return value
        guess = closest(str(value), [str(o) for o in options])
        extra = f"; did you mean {guess!r}?" if guess else ""
        self.fail(path, f"must be one of {', '.join(repr(o) for o in options)}, got {value!r}{extra}")
        return _INVALID

    def container(self, tp: Any, value: Any, path: str) -> Any:
        """A list/tuple (as a tuple) or a dict, each item converted to the item type."""
        if typing.get_origin(tp) is dict:
            if not isinstance(value, Mapping):
                return self.mismatch(path, tp, value)
            _, val_tp = typing.get_args(tp)
            items = {str(k): self.value(val_tp, v, _join(path, str(k)), {}) for k, v in value.items()}
            return _INVALID if _INVALID in items.values() else items
        if not isinstance(value, list | tuple):
            return self.mismatch(path, tp, value)
        item_tp = typing.get_args(tp)[0]
        converted = [self.value(item_tp, v, f"{path}[{i}]", {}) for i, v in enumerate(value)]
        return _INVALID if _INVALID in converted else tuple(converted)

    def tagged(self, choices: dict[str, type], value: Any, path: str) -> Any:
        """Build the variant of a union that the mapping's ``name`` selects."""
        if not isinstance(value, Mapping):
            return self.mismatch(path, dict, value)
        name = value.get("name")
        if name not in choices:
            guess = closest(str(name), list(choices))
            extra = f"; did you mean {guess!r}?" if guess else ""
            options = ", ".join(repr(c) for c in choices)
            self.fail(_join(path, "name"), f"must be one of {options}, got {name!r}{extra}")
            return _INVALID
        built = self.section(choices[name], value, path)
        return _INVALID if built is None else built

    def scalar(self, tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
        """Check a bool / int / float / str value and its bounds."""
        if tp is Any:
            return value
        if tp is bool:
            return value if isinstance(value, bool) else self.mismatch(path, tp, value)
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                return self.mismatch(path, tp, value)
        elif tp is float:
            number = _as_float(value)
            if number is None:
                return self.mismatch(path, tp, value)
            if not math.isfinite(number):  # NaN passes every bound, inf most: neither means anything as a knob
                self.fail(path, f"must be a finite number, got {value!r}")
                return _INVALID
            value = number
        elif tp is str and not isinstance(value, str):
            return self.mismatch(path, tp, value)
        return self.bounded(value, path, meta)

    def bounded(self, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
        """Check the ge / gt / le bounds declared on the knob."""
        checks = (
            ("ge", lambda b: value >= b, ">="),
            ("gt", lambda b: value > b, ">"),
            ("le", lambda b: value <= b, "<="),
        )
        for key, holds, sign in checks:
            bound = meta.get(key)
            if bound is not None and isinstance(value, int | float) and not holds(bound):
                self.fail(path, f"must be {sign} {bound:g}, got {value!r}")
                return _INVALID
        return value

    def mismatch(self, path: str, tp: Any, value: Any) -> Any:
        """Record a type mismatch."""
        self.fail(path, f"expected {type_name(tp)}, got {type(value).__name__} {value!r}")
        return _INVALID


_INVALID = object()


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            return None
    return None


def build_section(
    cls: type, raw: Any, path: str = "", index: Mapping[str, list[str]] | None = None
) -> tuple[Any, list[ConfigIssue]]:
    """Turn a raw mapping into section ``cls``; returns ``(section or None, issues)``.

    ``index`` maps a key name to the dotpaths where it is valid, so a key put in the wrong section is pointed home.
    """
    builder = _Builder(index)
    built = builder.section(cls, raw, path)
    return built, builder.issues


def to_plain(value: Any) -> Any:
    """A section (or any nested value) as plain YAML-ready data, defaults included."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    return value


class SchemaField(typing.NamedTuple):
    """One field of a section, at its dotpath: ``owner`` is the section class that has it (a sampler mode's own)."""

    path: str
    owner: type
    name: str
    type: Any


def nested_sections(tp: Any) -> list[type]:
    """The section classes a field of type ``tp`` holds: every member of a discriminated union, or the one section."""
    choices = discriminated_choices(tp)
    return list(choices.values()) if choices else [a for a in _flatten_optional(tp) if is_section(a)]


def walk_fields(cls: type, path: str = "") -> typing.Iterator[SchemaField]:
    """Every field under section ``cls``, depth first; a dotpath repeats once per union member that has it."""
    for name, tp in field_types(cls).items():
        here = _join(path, name)
        yield SchemaField(here, cls, name, tp)
        for sub in nested_sections(tp):
            yield from walk_fields(sub, here)


def key_index(cls: type, path: str = "") -> dict[str, list[str]]:
    """Every key name under section ``cls`` mapped to the dotpaths where it is valid (sampler modes included)."""
    index: dict[str, list[str]] = {}
    for fld in walk_fields(cls, path):
        paths = index.setdefault(fld.name, [])
        if fld.path not in paths:
            paths.append(fld.path)
    return index


def _flatten_optional(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]
