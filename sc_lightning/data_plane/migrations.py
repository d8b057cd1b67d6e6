"""Upgrading the rows of an older data-plane snapshot after its load, so a resume trains them like fresh rows.

Version 1 snapshots may hold trained rows from before per-token versions: no ``token_versions`` field. Such a
row was sampled, as far as its snapshot knows, under one weight version, the one its tags name
(``weight_version``, the version at the group's start), which is what training used for it then; the upgrade
writes that version on every completion token and -1 on the prompt (``prompt_lengths``, ``input_lengths``), the
layout :mod:`sc_lightning.controller.rows` writes. A row whose snapshot lacks what the upgrade needs is a
:class:`~sc_lightning.data_plane.snapshot_files.SnapshotFormatError` naming the version and the missing data.
Both backends call :func:`upgrade_rows` at the end of their ``load``, through the public data-plane API.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from sc_lightning.data_plane.base import DataPlane, MissingRowsError
from sc_lightning.data_plane.snapshot_files import SNAPSHOT_VERSION, SnapshotFormatError

log = logging.getLogger(__name__)

NEEDED_FIELDS = ("prompt_lengths", "input_lengths")
"""The row fields a version-1 row's token versions are rebuilt from (with its ``weight_version`` tag)."""


def upgrade_rows(data_plane: DataPlane, version: int, source: Path) -> int:
    """Bring the rows just loaded from ``source`` (a snapshot of ``version``) to :data:`SNAPSHOT_VERSION`; returns
    how many rows were rewritten (0 when nothing was missing)."""
    if version >= SNAPSHOT_VERSION:
        return 0
    keys = data_plane.keys()
    if not keys or _have_token_versions(data_plane, keys):
        return 0
    try:
        lengths = data_plane.get(keys, list(NEEDED_FIELDS))
    except MissingRowsError as err:
        raise _cannot_upgrade(version, source, f"the row fields {', '.join(NEEDED_FIELDS)} ({err})") from None
    tags = data_plane.tags(keys)
    untagged = [key for key, tag in zip(keys, tags, strict=True) if "weight_version" not in tag]
    if untagged:
        raise _cannot_upgrade(version, source, f"the weight_version tag of {len(untagged)} rows, e.g. {untagged[0]}")
    columns = [
        torch.tensor([-1] * prompt + [int(tag["weight_version"])] * (total - prompt), dtype=torch.int32)
        for prompt, total, tag in zip(
            (int(n) for n in lengths["prompt_lengths"]), (int(n) for n in lengths["input_lengths"]), tags, strict=True
        )
    ]
    data_plane.put(keys, {"token_versions": columns})
    log.info(
        "upgraded %d rows of the version-%d data-plane snapshot in %s: token_versions from each row's weight_version",
        len(keys),
        version,
        source,
    )
    return len(keys)


def _have_token_versions(data_plane: DataPlane, keys: list[str]) -> bool:
    """Whether every row has ``token_versions`` (a version-1 snapshot written after they were introduced)."""
    try:
        data_plane.get_packed(keys, ["token_versions"])
    except MissingRowsError:
        return False
    return True


def _cannot_upgrade(version: int, source: Path, missing: str) -> SnapshotFormatError:
    """The error for a snapshot whose rows lack ``missing``, needed to rebuild their token versions."""
    return SnapshotFormatError(
        f"the data-plane snapshot in {source} is of format version {version}: its rows have no token_versions and "
        f"lack {missing}, which rebuilding them needs; resume with the sc_lightning that wrote it, or start afresh "
        "with a new checkpointing.checkpoint_dir (nothing was deleted)"
    )
