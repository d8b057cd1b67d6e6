"""Argument checks shared by the data-plane backends (keys, fields, tags) and their error messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sc_lightning.data_plane.base import DataPlaneError

TAG_TYPES = (str, int, float, bool, type(None))
"""Types a tag value may have: primitives that survive every backend unchanged."""


def check_keys(keys: Sequence[str], *, unique: bool = True) -> list[str]:
    """Keys as a list of strings; DataPlaneError for a bare string, non-string keys or (if ``unique``) repeats."""
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise DataPlaneError(f"keys must be a sequence of strings, got {type(keys).__name__}")
    keys = list(keys)
    if set(map(type, keys)) - {str}:  # exactly str: a subclass would not survive a weights_only snapshot load
        bad = next(key for key in keys if type(key) is not str)
        raise DataPlaneError(f"keys must be strings, got {bad!r} ({type(bad).__name__})")
    if unique and len(set(keys)) != len(keys):
        seen: set[str] = set()
        repeated = [key for key in keys if key in seen or seen.add(key)]
        raise DataPlaneError(f"keys must be unique within one call; repeated: {name_list(repeated)}")
    return keys


def check_fields(fields: Sequence[str]) -> list[str]:
    """Field names as a list of strings without repeats (order kept); DataPlaneError for a bare string."""
    if isinstance(fields, str | bytes) or not isinstance(fields, Sequence):
        raise DataPlaneError(f"fields must be a sequence of field names, got {type(fields).__name__}")
    if not all(isinstance(field, str) for field in fields):
        raise DataPlaneError(f"field names must be strings, got {list(fields)!r}")
    return list(dict.fromkeys(fields))


def check_tags(tags: Sequence[Mapping[str, Any]] | None, num_rows: int) -> list[dict[str, Any]] | None:
    """Copies of the per-row tag dicts; DataPlaneError unless there is one mapping of primitives per row."""
    if tags is None:
        return None
    if isinstance(tags, Mapping) or not isinstance(tags, Sequence):
        raise DataPlaneError(f"tags must be a sequence with one dict per row, got {type(tags).__name__}")
    if len(tags) != num_rows:
        raise DataPlaneError(f"{len(tags)} tag dicts given for {num_rows} keys")
    copies = []
    for index, tag in enumerate(tags):
        if not isinstance(tag, Mapping):
            raise DataPlaneError(f"tags of row {index} must be a dict, got {type(tag).__name__}")
        for name, value in tag.items():
            if not isinstance(name, str) or not isinstance(value, TAG_TYPES):
                raise DataPlaneError(
                    f"tag {name!r} of row {index} is {value!r} ({type(value).__name__}); "
                    "tag names are strings and values are str, int, float, bool or None"
                )
        copies.append(dict(tag))
    return copies


def name_list(names: Sequence[str], limit: int = 8) -> str:
    """``['a', 'b', ...]`` with at most ``limit`` names, then how many more there are."""
    shown = ", ".join(repr(name) for name in names[:limit])
    more = len(names) - limit
    return f"[{shown}{f', ... ({more} more)' if more > 0 else ''}]"


def missing_message(partition_id: str, unknown: Sequence[str], missing_fields: Mapping[str, Sequence[str]]) -> str:
    """The MissingRowsError message: unknown keys, then each field and the requested rows that lack it."""
    parts = []
    if unknown:
        parts.append(f"{len(unknown)} key(s) not stored: {name_list(unknown)}")
    for field, keys in missing_fields.items():
        parts.append(f"field {field!r} missing on {len(keys)} row(s): {name_list(keys)}")
    return f"data plane partition {partition_id!r}: " + "; ".join(parts)
