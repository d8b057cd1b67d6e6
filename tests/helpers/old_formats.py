"""Older on-disk formats, made from today's: a data-plane snapshot of version 1 from before per-token versions, and
a bundle's manifest re-stamped after its files were edited (so it verifies, as the old writer's would have)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from sc_lightning.checkpoint.atomic import MANIFEST as BUNDLE_MANIFEST
from sc_lightning.data_plane.snapshot_files import MANIFEST, ROWS_FILE


def as_version_1_snapshot(directory: Path, *, drop_fields: tuple[str, ...] = ("token_versions",)) -> None:
    """Rewrite the neutral snapshot in ``directory`` (``rows.pt`` and ``manifest.json``) as version 1 whose rows
    lack ``drop_fields``: what an sc_lightning from before per-token versions wrote."""
    rows = directory / ROWS_FILE
    state = torch.load(rows, weights_only=True)
    state["version"] = 1
    state["fields"] = {field: data for field, data in state["fields"].items() if field not in drop_fields}
    torch.save(state, rows)
    set_manifest_version(directory, 1)


def set_manifest_version(directory: Path, version: int) -> None:
    """Stamp the data-plane snapshot's ``manifest.json`` in ``directory`` with format ``version``."""
    manifest = json.loads((directory / MANIFEST).read_text())
    (directory / MANIFEST).write_text(json.dumps({**manifest, "version": version}))


def restamp_bundle(bundle: Path) -> None:
    """Recompute each file's size and SHA-256 in ``bundle``'s manifest after a test edited its files."""
    path = bundle / BUNDLE_MANIFEST
    manifest = json.loads(path.read_text())
    manifest["files"] = {
        str(p.relative_to(bundle)): {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(bundle.rglob("*"))
        if p.is_file() and p.name != BUNDLE_MANIFEST
    }
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
