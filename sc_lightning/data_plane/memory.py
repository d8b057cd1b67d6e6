"""MemoryDataPlane: the in-process backend (tests, single-process runs).

Each put stores every field as one immutable block: the rows copied into one contiguous buffer, their lengths and
keys. Per field, a key maps to the block holding its row, so a later put of the same field just points the key at a
new block (column write-back); a block whose rows are all cleared or overwritten hands its buffer to a pool that
later puts of a similar size reuse (see ``BufferPool``). A get copies each run of consecutive rows of a block with
one slice into one new buffer and hands back row views of it, so no stored buffer is ever shared with a caller.
Per-key work stays in whole-list dict and list operations (no Python step per key): a put hashes its keys once, a
get of what one put wrote is recognised by one key-list comparison (see ``_Column``). One lock guards the maps;
copies happen outside it.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, NoReturn

import torch

from sc_lightning.data_plane.base import Columns, DataPlaneError, MissingRowsError
from sc_lightning.data_plane.checks import check_fields, check_keys, check_tags, missing_message
from sc_lightning.data_plane.codec import BufferPool, PackedRows, concat, pack_rows
from sc_lightning.data_plane.migrations import upgrade_rows
from sc_lightning.data_plane.snapshot_files import read_rows_snapshot, write_rows_snapshot


class _Block:
    """One put's rows of one field: a contiguous buffer, row lengths and row keys (immutable once built).

    Keys point at blocks; a block dies (and its buffer goes back to the pool) when no key and no running get
    refers to it any more, which CPython's reference counting detects at once. Row offsets and the key -> row
    map are built on first use (two threads racing both build the same value).
    """

    __slots__ = ("values", "lengths", "keys", "live", "pool", "_offsets", "_rows")

    def __init__(self, packed: PackedRows, keys: list[str], pool: BufferPool | None = None) -> None:
        self.values = packed.values
        self.lengths = packed.lengths
        self.keys = keys  # the key of each row
        self.live = len(keys)  # how many rows their key still points at (changed under the store's lock)
        self.pool = pool
        self._offsets: list[int] | None = None  # built on first need, as is _rows (key -> row)
        self._rows: dict[str, int] | None = None

    def row(self, key: str) -> int:
        """The row of ``key`` in this block (the key -> row map is built on first need)."""
        if self.keys[0] == key:
            return 0
        if self._rows is None:
            self._rows = dict(zip(self.keys, range(len(self.keys)), strict=True))
        return self._rows[key]

    def span(self, start: int, end: int) -> torch.Tensor:
        """The values of rows [start, end), a view of the buffer."""
        if start == 0 and end == len(self.keys):
            return self.values
        if self._offsets is None:
            self._offsets = PackedRows(self.values, self.lengths).offsets()
        return self.values[self._offsets[start] : self._offsets[end]]

    def __del__(self) -> None:
        if self.pool is not None:
            with contextlib.suppress(Exception):  # e.g. at interpreter shutdown
                self.pool.recycle(self.values)

    def schema(self) -> tuple[torch.dtype, torch.Size, bool]:
        """What rows of this block look like: dtype, trailing dims, whether they are per-row scalars."""
        return self.values.dtype, self.values.shape[1:], self.lengths is None


class _Column:
    """One field's rows: which block holds each key's row.

    A put of new keys only files its block under its first key (``heads``); the per-key ``index`` learns its keys
    when a key must be looked up one by one (``indexed``), which a get of what one put wrote and a clear of exactly
    those keys never need. Every block in ``heads`` is whole (each of its keys still points at it): anything that
    could change that indexes it first.
    """

    __slots__ = ("index", "heads")

    def __init__(self, index: dict[str, _Block] | None = None) -> None:
        self.index: dict[str, _Block] = {} if index is None else index
        self.heads: dict[str, _Block] = {}  # first key -> a whole block not yet in index

    def indexed(self) -> dict[str, _Block]:
        """The key -> block map of every row, indexing the blocks in ``heads`` first."""
        if self.heads:
            for block in self.heads.values():
                self.index.update(zip(block.keys, repeat(block)))
            self.heads = {}
        return self.index


_Run = tuple[_Block, int, int]  # rows [start, end) of a block
_ABSENT = object()


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
        self._tags: dict[str, dict[str, Any] | None] = {}  # every stored key -> its merged tags (None: none yet)
        self._columns: dict[str, _Column] = {}  # field -> which block holds each key's row
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryDataPlane(partition_id={self.partition_id!r}, rows={len(self._tags)}, capacity={self.capacity})"

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise TypeError(
            "MemoryDataPlane lives in one process and cannot be pickled or sent to another process "
            "(Ray actor, subprocess); use data_plane.backend='simple' (TransferQueue) to share rows across processes"
        )

    # noqa reason: the hot path of every commit; its fast paths (all keys new, no column index yet) are inline
    # branches so a put of fresh rows makes no per-row Python call (benchmarks/data_plane.py)
    def put(  # noqa: C901
        self,
        keys: Sequence[str],
        fields: Columns | None = None,
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Create or update rows: write each field (copied) and merge each row's tags; all-or-nothing."""
        keys = check_keys(keys, unique=False)
        fresh = dict.fromkeys(keys)  # hashes each key once: the uniqueness check, and the new keys' empty tags
        if len(fresh) != len(keys):
            check_keys(keys)  # raises, naming the repeated keys
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
            blocks[field] = _Block(pack_rows(field, rows, count, self._pool.allocate), keys, self._pool)
        with self._lock:
            self._check_open()
            stored = self._tags
            all_new = stored.keys().isdisjoint(fresh.keys())  # a view: iterates the smaller side
            new = keys if all_new else [key for key in keys if key not in stored]
            if self.capacity is not None and len(stored) + len(new) > self.capacity:
                raise DataPlaneError(
                    f"data plane partition {self.partition_id!r} is full: {len(stored)} rows stored + {len(new)} "
                    f"new > capacity {self.capacity}; nothing was written (clear consumed rows or raise the capacity)"
                )
            stored.update(fresh if all_new else dict.fromkeys(new))
            for key, tag in zip(keys, tag_copies or (), strict=False):  # tag_copies: fresh copies, one per key
                current = stored[key]
                stored[key] = tag if current is None else current | tag
            for field, block in blocks.items():
                column = self._columns.get(field)
                if column is None:
                    column = self._columns[field] = _Column()
                if all_new or not (column.index or column.heads):  # no key of this put has a row of this field
                    column.heads[keys[0]] = block
                    continue
                index = column.indexed()
                if not index.keys().isdisjoint(fresh.keys()):  # column write-back: the old rows lose their keys
                    for key in keys:
                        old = index.get(key)
                        if old is not None:
                            old.live -= 1
                index.update(zip(keys, repeat(block)))

    def get(self, keys: Sequence[str], fields: Sequence[str]) -> dict[str, list[torch.Tensor]]:
        """Read ``fields`` of ``keys`` (copies, in key order); MissingRowsError on any unknown key or field."""
        return {field: packed.rows() for field, packed in self.get_packed(keys, fields).items()}

    def get_packed(self, keys: Sequence[str], fields: Sequence[str]) -> dict[str, PackedRows]:
        """Read ``fields`` of ``keys`` as one copied buffer per field (rows in key order, with their lengths)."""
        if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
            check_keys(keys)  # raises
        keys = list(keys)  # key types and repeats: checked by _runs
        fields = check_fields(fields)
        with self._lock:
            self._check_open()
            if not keys:
                return {field: PackedRows(torch.empty(0), []) for field in fields}
            runs = self._runs(keys, fields)
        return {field: PackedRows(*_gather(field, field_runs)) for field, field_runs in runs.items()}

    def tags(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The merged tags of each key, in key order; MissingRowsError on unknown keys."""
        keys = check_keys(keys)
        with self._lock:
            self._check_open()
            try:
                return [dict(tag) if tag else {} for tag in map(self._tags.__getitem__, keys)]
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
            tags = [dict(tag) if tag else {} for tag in self._tags.values()]
            position = {key: index for index, key in enumerate(keys)}
            columns = {field: column.indexed().copy() for field, column in self._columns.items()}
        fields = {}
        for field, index in columns.items():
            items = list(index)
            values, lengths = _gather(field, _split_runs(items, list(index.values())))
            fields[field] = {
                "rows": torch.tensor([position[key] for key in items], dtype=torch.int64),
                "values": values,
                "lengths": None if lengths is None else torch.tensor(lengths, dtype=torch.int64),
            }
        state = {"partition_id": self.partition_id, "keys": keys, "tags": tags, "fields": fields}
        write_rows_snapshot(Path(directory), state, backend="memory")

    def load(self, directory: str | Path) -> None:
        """Replace every row with a snapshot written by ``save`` (an older version's rows upgraded: see
        :mod:`~sc_lightning.data_plane.migrations`); on any error the contents stay as they were."""
        state = read_rows_snapshot(Path(directory), self.partition_id)
        keys = state["keys"]
        if self.capacity is not None and len(keys) > self.capacity:
            raise DataPlaneError(
                f"snapshot in {directory} holds {len(keys)} rows, more than the capacity {self.capacity}"
            )
        columns: dict[str, _Column] = {}
        for field, data in state["fields"].items():
            try:
                lengths = None if data["lengths"] is None else data["lengths"].tolist()
                rows = data["rows"].tolist()
                packed = PackedRows(data["values"], lengths)
                block = _Block(packed, [keys[row] for row in rows], self._pool)
                total = packed.num_rows if lengths is None else sum(lengths)  # rows (scalars) or first-dim entries
                consistent = total == packed.values.shape[0] and packed.num_rows == len(rows)
                columns[field] = _Column(dict.fromkeys(block.keys, block))
            except (KeyError, IndexError, TypeError, AttributeError):
                consistent = False
            if not consistent:
                raise DataPlaneError(f"snapshot in {directory}: field {field!r} is inconsistent (corrupt file?)")
        with self._lock:
            self._check_open()
            before = self._tags, self._columns
            self._tags = {key: dict(tag) for key, tag in zip(keys, state["tags"], strict=True)}
            self._columns = columns
        try:
            upgrade_rows(self, state["version"], Path(directory))
        except DataPlaneError:
            with self._lock:
                self._tags, self._columns = before
            raise

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

    def _runs(self, keys: list[str], fields: list[str]) -> dict[str, list[_Run]]:
        """The requested rows of each field as runs of consecutive block rows; errors for repeated or absent keys.

        Fast path: ``keys`` are consecutive rows of one block that every one of its keys still points at, which
        one list comparison shows; such keys are then also strings, unique and stored, as the block's keys were
        when put, so only the other path checks them one by one.
        """
        runs = {}
        for field in fields:
            column = self._columns.get(field)
            if column is None or not isinstance(keys[0], str):
                break
            entry = column.index.get(keys[0]) or column.heads.get(keys[0])  # a block is always truthy
            if entry is None:
                break
            row = entry.row(keys[0])
            end = row + len(keys)
            if entry.live != len(entry.keys) or entry.keys[row:end] != keys:
                break
            runs[field] = [(entry, row, end)]
        if fields and len(runs) == len(fields):
            return runs
        check_keys(keys)  # raises for keys other than strings, or repeated
        if not fields and not all(key in self._tags for key in keys):
            self._raise_missing(keys, fields)
        lookup = itemgetter(*keys) if len(keys) > 1 else lambda column: (column[keys[0]],)
        for field in fields:
            if field not in runs:
                try:
                    runs[field] = _split_runs(keys, lookup(self._columns[field].indexed()))
                except KeyError:
                    self._raise_missing(keys, fields)
        return runs

    def _raise_missing(self, keys: list[str], fields: list[str]) -> NoReturn:
        unknown = [key for key in keys if key not in self._tags]
        known = [key for key in keys if key in self._tags]
        missing = {}
        for field in fields:
            column = self._columns[field].indexed() if field in self._columns else {}
            absent = [key for key in known if key not in column]
            if absent:
                missing[field] = absent
        raise MissingRowsError(missing_message(self.partition_id, unknown, missing))

    def _clear(self, keys: Sequence[str]) -> None:
        popped = list(map(self._tags.pop, keys, repeat(_ABSENT)))  # whole-list dict work, no Python step per key
        removed = [k for k, tag in zip(keys, popped, strict=True) if tag is not _ABSENT] if _ABSENT in popped else keys
        if not removed:
            return
        for field, column in list(self._columns.items()):
            whole = column.heads.get(removed[0])
            if whole is not None and whole.keys == removed:  # exactly the keys of one put: no per-key work
                del column.heads[removed[0]]
                whole.live = 0
            else:
                index = column.indexed()
                for block, count in Counter(map(index.pop, removed, repeat(None))).items():
                    if block is not None:
                        block.live -= count
            if not column.index and not column.heads:
                del self._columns[field]


def _split_runs(keys: Sequence[str], blocks: Sequence[_Block]) -> list[_Run]:
    """Group the rows of ``keys`` (held by ``blocks``) into maximal runs of consecutive rows of one block, in order."""
    if not keys:
        return []
    first = blocks[0]
    start = first.row(keys[0])
    if blocks.count(first) == len(blocks) and first.keys[start : start + len(keys)] == list(keys):
        return [(first, start, start + len(keys))]  # one run: checked without a Python step per row
    runs = []
    block, end = first, start
    for key, key_block in zip(keys, blocks, strict=True):
        row = key_block.row(key)
        if key_block is block and row == end:
            end += 1
            continue
        runs.append((block, start, end))
        block, start, end = key_block, row, row + 1
    runs.append((block, start, end))
    return runs


def _gather(field: str, runs: Sequence[_Run]) -> tuple[torch.Tensor, list[int] | None]:
    """Copy the given rows into one new buffer: one slice per run of consecutive rows of a block, then one join."""
    if not runs:
        return torch.empty(0), []
    if len(runs) == 1:  # the usual case: one slice, one copy; the stored lengths list is only read, never copied
        block, start, end = runs[0]
        whole = start == 0 and end == len(block.keys)
        lengths = block.lengths if whole or block.lengths is None else block.lengths[start:end]
        return concat([block.span(start, end)]), lengths
    schema = runs[0][0].schema()
    pieces, lengths = [], []
    for block, start, end in runs:
        if block.schema() != schema:
            raise DataPlaneError(
                f"field {field!r} was written with different dtypes or shapes {schema} and {block.schema()}; "
                "rows read together must share dtype and trailing dims"
            )
        pieces.append(block.span(start, end))
        if block.lengths is not None:
            lengths.extend(block.lengths[start:end])
    return concat(pieces), None if schema[2] else lengths
