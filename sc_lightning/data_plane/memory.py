"""MemoryDataPlane: the in-process backend (tests, single-process runs), and the backend-neutral snapshot format.

Each put stores every field as one immutable block: the rows copied into one contiguous buffer plus their offsets.
A key maps to (block, row index) per field, so a later put of the same field just points the key at a new block
(column write-back); a block whose rows are all cleared or overwritten hands its buffer to a pool that later
puts of a similar size reuse (see ``BufferPool``). A get copies each run of consecutive rows out of a block with
one slice, joins the runs into one new buffer and hands back row views of it, so no stored buffer is ever shared
with a caller. One lock guards the maps; copies happen outside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from itertools import repeat
from pathlib import Path
from typing import Any, NoReturn

import torch

from sc_lightning.data_plane.base import Columns, DataPlaneError, MissingRowsError
from sc_lightning.data_plane.codec import (
    BufferPool,
    PackedRows,
    check_fields,
    check_keys,
    check_tags,
    concat,
    missing_message,
    pack_rows,
    unpack,
)

MANIFEST = "manifest.json"
"""Written by every backend's save: format, version, backend, partition and row count."""
ROWS_FILE = "rows.pt"
"""The backend-neutral snapshot (torch.save of keys, tags and packed fields), loadable with weights_only."""
SNAPSHOT_FORMAT = "sc_lightning.data_plane"
SNAPSHOT_VERSION = 1


class _Block:
    """One put's rows of one field: a contiguous buffer and where each row starts (immutable once built).

    Keys point into blocks; a block dies (and its buffer goes back to the pool) when no key and no running get
    refers to it any more, which CPython's reference counting detects at once.
    """

    __slots__ = ("values", "lengths", "offsets", "pool")

    def __init__(self, packed: PackedRows, pool: BufferPool | None = None) -> None:
        self.values = packed.values
        self.lengths = packed.lengths
        self.offsets = packed.offsets()
        self.pool = pool

    def __del__(self) -> None:
        if self.pool is not None:
            with contextlib.suppress(Exception):  # e.g. at interpreter shutdown
                self.pool.recycle(self.values)

    def schema(self) -> tuple[torch.dtype, torch.Size, bool]:
        """What rows of this block look like: dtype, trailing dims, whether they are per-row scalars."""
        return self.values.dtype, self.values.shape[1:], self.lengths is None


_Entry = tuple[_Block, int]


class MemoryDataPlane:
    """In-process data plane: copies on put and get, strict reads, optional capacity in rows; not picklable."""

    def __init__(
        self, partition_id: str = "rollout_data", capacity: int | None = None, pool_bytes: int = 256 * 2**20
    ) -> None:
        """An empty store of at most ``capacity`` rows (None = unlimited).

        ``pool_bytes`` bounds the memory kept from cleared rows for reuse by later puts (0 = none).
        """
        if capacity is not None and capacity < 1:
            raise DataPlaneError(f"capacity must be at least 1 row, got {capacity}")
        self.partition_id = partition_id
        self.capacity = capacity
        self._pool = BufferPool(pool_bytes)
        self._lock = threading.Lock()
        self._tags: dict[str, dict[str, Any]] = {}  # every stored key -> its merged tags
        self._columns: dict[str, dict[str, _Entry]] = {}  # field -> key -> (block, row)
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryDataPlane(partition_id={self.partition_id!r}, rows={len(self._tags)}, capacity={self.capacity})"

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise TypeError(
            "MemoryDataPlane lives in one process and cannot be pickled or sent to another process "
            "(Ray actor, subprocess); use data_plane.backend='simple' (TransferQueue) to share rows across processes"
        )

    def put(
        self,
        keys: Sequence[str],
        fields: Columns | None = None,
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Create or update rows: write each field (copied) and merge each row's tags; all-or-nothing."""
        keys = check_keys(keys)
        count = len(keys)
        tag_copies = check_tags(tags, count)
        blocks = {}
        for field, rows in (fields or {}).items():
            if not isinstance(field, str):
                raise DataPlaneError(f"field names must be strings, got {field!r}")
            if count == 0:
                if len(rows) != 0:
                    raise DataPlaneError(f"field {field!r} has {len(rows)} rows but 0 keys were given")
                continue
            blocks[field] = _Block(pack_rows(field, rows, count, self._pool.allocate), self._pool)
        with self._lock:
            self._check_open()
            stored = self._tags
            new = [key for key in keys if key not in stored]
            if self.capacity is not None and len(stored) + len(new) > self.capacity:
                raise DataPlaneError(
                    f"data plane partition {self.partition_id!r} is full: {len(stored)} rows stored + {len(new)} "
                    f"new > capacity {self.capacity}; nothing was written (clear consumed rows or raise the capacity)"
                )
            stored.update((key, {}) for key in new)
            if tag_copies is not None:
                for key, tag in zip(keys, tag_copies, strict=True):
                    if tag:
                        stored[key].update(tag)
            for field, block in blocks.items():
                cells = zip(repeat(block), range(count), strict=False)  # (block, row) of each key
                self._columns.setdefault(field, {}).update(zip(keys, cells, strict=False))

    def get(self, keys: Sequence[str], fields: Sequence[str]) -> dict[str, list[torch.Tensor]]:
        """Read ``fields`` of ``keys`` (copies, in key order); MissingRowsError on any unknown key or field."""
        keys = check_keys(keys)
        fields = check_fields(fields)
        with self._lock:
            self._check_open()
            if not keys:
                return {field: [] for field in fields}
            entries = self._entries(keys, fields)
        return {field: unpack(*_gather(field, column)) for field, column in entries.items()}

    def tags(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The merged tags of each key, in key order; MissingRowsError on unknown keys."""
        keys = check_keys(keys)
        with self._lock:
            self._check_open()
            try:
                return [dict(self._tags[key]) for key in keys]
            except KeyError:
                self._raise_missing(keys, [])

    def keys(self) -> list[str]:
        """Every stored key, oldest first."""
        with self._lock:
            self._check_open()
            return list(self._tags)

    def clear(self, keys: Sequence[str]) -> None:
        """Delete rows; unknown keys are ignored, so clearing twice is harmless."""
        keys = check_keys(keys, unique=False)
        with self._lock:
            self._check_open()
            self._clear(keys)

    def save(self, directory: str | Path) -> None:
        """Write a backend-neutral snapshot (``rows.pt`` and ``manifest.json``) of every row into ``directory``."""
        with self._lock:
            self._check_open()
            keys = list(self._tags)
            tags = [dict(self._tags[key]) for key in keys]
            position = {key: index for index, key in enumerate(keys)}
            columns = {field: list(column.items()) for field, column in self._columns.items()}
        fields = {}
        for field, items in columns.items():
            values, lengths = _gather(field, [entry for _, entry in items])
            fields[field] = {
                "rows": torch.tensor([position[key] for key, _ in items], dtype=torch.int64),
                "values": values,
                "lengths": None if lengths is None else torch.tensor(lengths, dtype=torch.int64),
            }
        state = {"partition_id": self.partition_id, "keys": keys, "tags": tags, "fields": fields}
        write_rows_snapshot(Path(directory), state, backend="memory")

    def load(self, directory: str | Path) -> None:
        """Replace every row with a snapshot written by ``save``; on any error the contents stay as they were."""
        state = read_rows_snapshot(Path(directory), self.partition_id)
        keys = state["keys"]
        if self.capacity is not None and len(keys) > self.capacity:
            raise DataPlaneError(
                f"snapshot in {directory} holds {len(keys)} rows, more than the capacity {self.capacity}"
            )
        columns: dict[str, dict[str, _Entry]] = {}
        for field, data in state["fields"].items():
            try:
                lengths = None if data["lengths"] is None else data["lengths"].tolist()
                block = _Block(PackedRows(data["values"], lengths), self._pool)
                rows = data["rows"].tolist()
                consistent = block.offsets[-1] == data["values"].shape[0] and len(block.offsets) == len(rows) + 1
                columns[field] = {keys[row]: (block, index) for index, row in enumerate(rows)}
            except (KeyError, IndexError, TypeError, AttributeError):
                consistent = False
            if not consistent:
                raise DataPlaneError(f"snapshot in {directory}: field {field!r} is inconsistent (corrupt file?)")
        with self._lock:
            self._check_open()
            self._tags = {key: dict(tag) for key, tag in zip(keys, state["tags"], strict=True)}
            self._columns = columns

    def close(self) -> None:
        """Drop every row and refuse further use; idempotent."""
        with self._lock:
            self._closed = True
            self._tags = {}
            self._columns = {}
        self._pool.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise DataPlaneError(f"data plane partition {self.partition_id!r} is closed")

    def _entries(self, keys: list[str], fields: list[str]) -> dict[str, list[_Entry]]:
        """(block, row) of every requested cell, per field; MissingRowsError naming what is absent."""
        if not fields and not all(key in self._tags for key in keys):
            self._raise_missing(keys, fields)
        try:
            return {field: [self._columns[field][key] for key in keys] for field in fields}
        except KeyError:
            self._raise_missing(keys, fields)

    def _raise_missing(self, keys: list[str], fields: list[str]) -> NoReturn:
        unknown = [key for key in keys if key not in self._tags]
        known = [key for key in keys if key in self._tags]
        missing = {}
        for field in fields:
            column = self._columns.get(field, {})
            absent = [key for key in known if key not in column]
            if absent:
                missing[field] = absent
        raise MissingRowsError(missing_message(self.partition_id, unknown, missing))

    def _clear(self, keys: Sequence[str]) -> None:
        removed = [key for key in keys if self._tags.pop(key, None) is not None]
        if not removed:
            return
        for field in list(self._columns):
            column = self._columns[field]
            for key in removed:
                column.pop(key, None)
            if not column:
                del self._columns[field]


def _gather(field: str, entries: Sequence[_Entry]) -> tuple[torch.Tensor, list[int] | None]:
    """Copy the given rows into one new buffer: one slice per run of consecutive rows of a block, then one join."""
    pieces: list[torch.Tensor] = []
    lengths: list[int] | None = []
    block: _Block | None = None
    start = end = 0
    schema = entries[0][0].schema() if entries else None
    for entry_block, row in entries:
        if entry_block is block and row == end:
            end += 1
            continue
        if block is not None:
            _take(block, start, end, pieces, lengths)
        if entry_block.schema() != schema:
            raise DataPlaneError(
                f"field {field!r} was written with different dtypes or shapes {schema} and {entry_block.schema()}; "
                "rows read together must share dtype and trailing dims"
            )
        block, start, end = entry_block, row, row + 1
    if block is None:
        return torch.empty(0), []
    _take(block, start, end, pieces, lengths)
    values = concat(pieces)
    return values, None if block.lengths is None else lengths


def _take(block: _Block, start: int, end: int, pieces: list[torch.Tensor], lengths: list[int]) -> None:
    pieces.append(block.values[block.offsets[start] : block.offsets[end]])
    if block.lengths is not None:
        lengths.extend(block.lengths[start:end])


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
    if state.get("format") != SNAPSHOT_FORMAT or state.get("version") != SNAPSHOT_VERSION:
        raise DataPlaneError(f"{path} is not a version-{SNAPSHOT_VERSION} {SNAPSHOT_FORMAT} snapshot")
    if len(state["tags"]) != len(state["keys"]):
        raise DataPlaneError(f"{path}: {len(state['keys'])} keys but {len(state['tags'])} tag dicts (corrupt file?)")
    return state


def write_manifest(directory: Path, *, backend: str, partition_id: str, rows: int) -> None:
    """Write ``manifest.json`` describing a snapshot."""
    manifest = {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "backend": backend,
        "partition_id": partition_id,
        "rows": rows,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def read_manifest(directory: Path, partition_id: str) -> dict[str, Any]:
    """Read and check ``manifest.json``; DataPlaneError when missing, of another format, or of another partition."""
    path = directory / MANIFEST
    if not path.exists():
        raise DataPlaneError(f"no data-plane snapshot in {directory} ({MANIFEST} is missing)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != SNAPSHOT_FORMAT or manifest.get("version") != SNAPSHOT_VERSION:
        raise DataPlaneError(f"{path} is not a version-{SNAPSHOT_VERSION} {SNAPSHOT_FORMAT} manifest")
    if manifest.get("partition_id") != partition_id:
        raise DataPlaneError(
            f"snapshot in {directory} is of partition {manifest.get('partition_id')!r}, "
            f"not {partition_id!r}; load it with a data plane of that partition"
        )
    return manifest
