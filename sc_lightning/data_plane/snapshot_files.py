"""The backend-neutral data-plane snapshot format: ``rows.pt`` and ``manifest.json``, shared by every backend.

``manifest.json`` (written by every backend's ``save``) names the format, its version, the backend, the partition
and the row count, so a load can say which backend a snapshot needs. ``rows.pt`` holds keys, tags and packed
fields (``torch.save``, loadable with ``weights_only``); the memory backend writes it, and TransferQueue reads it
when loading a snapshot of another backend.

Versions: 2 is written; 1 (rows that may predate ``token_versions``) is read and upgraded after the load
(:mod:`~sc_lightning.data_plane.migrations`); a newer one is a :class:`SnapshotFormatError`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from sc_lightning.data_plane.base import DataPlaneError

MANIFEST = "manifest.json"
"""Written by every backend's save: format, version, backend, partition and row count."""
ROWS_FILE = "rows.pt"
"""The backend-neutral snapshot (torch.save of keys, tags and packed fields), loadable with weights_only."""
SNAPSHOT_FORMAT = "sc_lightning.data_plane"
SNAPSHOT_VERSION = 2
"""The version written. 2: every trained row has ``token_versions``; 1 may lack them (migrated on load)."""
READABLE_VERSIONS = (1, 2)
"""The versions a load accepts (older ones go through :func:`sc_lightning.data_plane.migrations.upgrade_rows`)."""


class SnapshotFormatError(DataPlaneError):
    """A data-plane snapshot in a format this code cannot read or migrate; the message names the version and why."""


def write_rows_snapshot(directory: Path, state: dict[str, Any], *, backend: str) -> None:
    """Write ``rows.pt`` (atomically: temp file, then rename) and ``manifest.json`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, **state}
    tmp = directory / f".{ROWS_FILE}.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, directory / ROWS_FILE)
    write_manifest(directory, backend=backend, partition_id=state["partition_id"], rows=len(state["keys"]))


def read_rows_snapshot(directory: Path, partition_id: str) -> dict[str, Any]:
    """Read a backend-neutral snapshot, checking format, version and partition; DataPlaneError if it does not fit."""
    manifest = read_manifest(directory, partition_id)
    path = directory / ROWS_FILE
    if not path.exists():
        raise DataPlaneError(
            f"{directory} holds a {manifest['backend']!r} snapshot without {ROWS_FILE}; "
            f"load it with data_plane.backend={manifest['backend']!r}"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    check_version(path, state)
    if len(state["tags"]) != len(state["keys"]):
        raise DataPlaneError(f"{path}: {len(state['keys'])} keys but {len(state['tags'])} tag dicts (corrupt file?)")
    return state


def write_manifest(directory: Path, *, backend: str, partition_id: str, rows: int) -> None:
    """Write ``manifest.json`` describing a snapshot."""
    manifest = {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "backend": backend}
    manifest.update(partition_id=partition_id, rows=rows)
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def read_manifest(directory: Path, partition_id: str) -> dict[str, Any]:
    """Read and check ``manifest.json``; DataPlaneError when missing, of another format, or of another partition."""
    path = directory / MANIFEST
    if not path.exists():
        raise DataPlaneError(f"no data-plane snapshot in {directory} ({MANIFEST} is missing)")
    manifest = json.loads(path.read_text())
    check_version(path, manifest)
    if manifest.get("partition_id") != partition_id:
        raise DataPlaneError(
            f"snapshot in {directory} is of partition {manifest.get('partition_id')!r}, "
            f"not {partition_id!r}; load it with a data plane of that partition"
        )
    return manifest


def check_version(path: Path, written: dict[str, Any]) -> None:
    """DataPlaneError unless ``written`` (a manifest or ``rows.pt``) is of this format; SnapshotFormatError when of
    a version this code does not read."""
    if written.get("format") != SNAPSHOT_FORMAT:
        raise DataPlaneError(f"{path} is not a {SNAPSHOT_FORMAT} snapshot (format {written.get('format')!r})")
    version = written.get("version")
    if version not in READABLE_VERSIONS:
        raise SnapshotFormatError(
            f"{path} is a data-plane snapshot of format version {version!r}; this sc_lightning reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}: resume with the sc_lightning that wrote it "
            "(nothing was deleted)"
        )
