"""Column form <-> packed buffers: packing with its checks, unpacking, and the buffer pool.

Column form (what callers put and get): field name -> one tensor per row. A row of a field is either a 0-d tensor
(a per-row scalar) or a tensor of one or more dims whose first dim may differ between rows (jagged, e.g. tokens);
all rows of a field share dtype and trailing dims. Packed form (``PackedRows``): the rows of one field copied into
one contiguous buffer, concatenated along dim 0 (stacked for scalars), plus the row lengths. TransferQueue's wire
form is in ``wire.py``; the checks of keys, fields and tags in ``checks.py``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sc_lightning.data_plane.base import DataPlaneError

_SERIAL_CAT_ELEMENTS = 32_768
"""ATen's GRAIN_SIZE: a CPU ``torch.cat`` whose output is smaller takes the serial memcpy kernel. Above it, cat
builds one TensorIterator per input, which costs about 0.5 us per row; ``concat`` batches rows under the limit."""


@dataclass(frozen=True)
class PackedRows:
    """The rows of one field in one buffer: ``values`` concatenated along dim 0, or stacked ``(N,)`` for scalars."""

    values: torch.Tensor
    lengths: list[int] | None
    """First-dim length of each row; None when the rows are per-row scalars (0-d)."""

    @property
    def num_rows(self) -> int:
        """Number of rows packed."""
        return self.values.shape[0] if self.lengths is None else len(self.lengths)

    def offsets(self) -> list[int]:
        """Start of each row in ``values`` along dim 0, plus the end: ``num_rows + 1`` entries."""
        if self.lengths is None:
            return list(range(self.values.shape[0] + 1))
        return list(itertools.accumulate(self.lengths, initial=0))

    def rows(self) -> list[torch.Tensor]:
        """The rows as views of ``values`` (0-d views for scalars)."""
        return unpack(self.values, self.lengths)


POOL_MIN_BYTES = 64 * 1024
"""Smaller buffers are left to the allocator: recycling them saves nothing measurable."""


def _size_class(nbytes: int, *, up: bool) -> int:
    """Round to a size class: 16 classes per power of two, so recycled buffers waste at most 1/16."""
    shift = max(nbytes.bit_length() - 5, 0)
    if up:
        nbytes += (1 << shift) - 1
    return (nbytes >> shift) << shift


class BufferPool:
    """Buffers of dropped blocks, kept for later puts of a similar size (up to ``max_bytes`` in all).

    Fresh memory costs a page fault per page on first touch, which on this project's VMs is many times the cost
    of copying into it (about 0.7 ms per MiB against 0.02 ms to copy a cached MiB); a steady put/clear cycle
    therefore packs into recycled, already-mapped buffers. Thread-safe.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._free: dict[int, list[torch.UntypedStorage]] = {}  # size class -> storages of at least that size
        self._bytes = 0
        self._lock = threading.RLock()  # re-entrant: a block's __del__ may recycle from inside a locked section

    def allocate(self, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised contiguous tensor, backed by a recycled buffer when one of the right size is free."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < POOL_MIN_BYTES or self.max_bytes <= 0:
            return torch.empty(shape, dtype=dtype)
        size = _size_class(nbytes, up=True)
        storage = None
        with self._lock:
            free = self._free.get(size)
            if free:
                storage = free.pop()
                self._bytes -= storage.nbytes()
        if storage is None:
            storage = torch.empty(size, dtype=torch.uint8).untyped_storage()
        return torch.empty(0, dtype=dtype).set_(storage, 0, shape)  # not a view: later splits of it stay cheap

    def clear(self) -> None:
        """Drop every kept buffer (back to the allocator)."""
        with self._lock:
            self._free.clear()
            self._bytes = 0

    def recycle(self, values: torch.Tensor) -> None:
        """Keep the storage behind ``values`` (no longer used by anyone) for a later ``allocate``."""
        storage = values.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes < POOL_MIN_BYTES or values.device.type != "cpu":
            return
        with self._lock:
            if self._bytes + nbytes > self.max_bytes:
                return
            self._free.setdefault(_size_class(nbytes, up=False), []).append(storage)
            self._bytes += nbytes


def unpack(values: torch.Tensor, lengths: list[int] | None) -> list[torch.Tensor]:
    """Rows of a packed buffer as views: split along dim 0 by ``lengths``, or 0-d views when ``lengths`` is None.

    Unless ``values`` requires grad, jagged rows come from ``unsafe_split_with_sizes``: the same views without
    autograd's view tracking, about 0.17 instead of 0.23 us a row. Each row then has its own version counter, which is
    exact since the rows never overlap; only ``row._base`` (None instead of ``values``) tells them apart.
    """
    if lengths is None:
        return list(values.unbind(0))
    if values.requires_grad:
        return list(values.split(lengths))
    return list(values.unsafe_split_with_sizes(lengths))


def concat(tensors: Sequence[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.cat`` along dim 0 into a new buffer (or ``out``); with several threads, in serial-sized batches.

    With more than one intra-op thread, a CPU cat whose output exceeds ATen's GRAIN_SIZE copies input by input
    through a parallel TensorIterator (about 0.5 us per input, and stalls when the other cores are busy);
    batches of inputs whose output stays under GRAIN_SIZE take the serial memcpy kernel instead.
    """
    if len(tensors) == 1:
        if out is None:
            return tensors[0].clone(memory_format=torch.contiguous_format)
        return out.copy_(tensors[0])
    first = tensors[0]
    if first.device.type != "cpu" or torch.get_num_threads() == 1:
        return torch.cat(tensors, out=out) if out is not None else torch.cat(tensors)
    ends = list(itertools.accumulate(t.numel() for t in tensors))  # element offset after each input
    if ends[-1] < _SERIAL_CAT_ELEMENTS:
        return torch.cat(tensors, out=out) if out is not None else torch.cat(tensors)
    row_elements = math.prod(first.shape[1:])  # > 0 here, since the inputs hold elements
    if out is None:
        out = first.new_empty((ends[-1] // row_elements, *first.shape[1:]))
    start = position = 0
    while start < len(tensors):
        limit = (ends[start - 1] if start else 0) + _SERIAL_CAT_ELEMENTS
        stop = max(bisect.bisect_left(ends, limit, lo=start), start + 1)  # inputs [start, stop) fit under it
        chunk = tensors[start:stop]
        rows = (ends[stop - 1] - (ends[start - 1] if start else 0)) // row_elements
        torch.cat(chunk, out=out[position : position + rows])
        start, position = stop, position + rows
    return out


_PLAIN_TENSOR = {torch.Tensor}
_DTYPE = operator.attrgetter("dtype")
_LENGTH = torch._C.TensorBase.__len__
"""First-dim length; the C slot, about 5x cheaper than ``len(row)`` (Python-level ``Tensor.__len__``)."""

Allocate = Callable[[torch.dtype, tuple[int, ...]], torch.Tensor]
"""Returns an uninitialised contiguous CPU tensor of the given dtype and shape (e.g. from a buffer pool)."""


# noqa reason: per-row checks and the copy plan share one pass over the rows (shapes, dtypes, lengths), so a
# large put costs one Python loop, not one per check (benchmarks/data_plane.py)
def pack_rows(  # noqa: C901
    field: str,
    rows: Sequence[torch.Tensor] | torch.Tensor,
    num_rows: int | None = None,
    allocate: Allocate | None = None,
) -> PackedRows:
    """Check one field's rows (tensors, one dtype, same trailing dims) and copy them into one CPU buffer.

    ``rows`` may also be a tensor whose dim 0 indexes rows: a dense ``(N, ...)`` tensor or a jagged nested tensor.
    ``allocate`` supplies the buffer of a jagged field (default: a new tensor). Raises DataPlaneError naming
    ``field`` on any violation, or when there are not ``num_rows`` rows.
    """
    if isinstance(rows, torch.Tensor):
        return _pack_tensor(field, rows, num_rows, allocate)
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
        raise DataPlaneError(
            f"field {field!r}: expected a sequence of tensors (one per row), got {type(rows).__name__}"
        )
    count = len(rows)
    if num_rows is not None and count != num_rows:
        raise DataPlaneError(f"field {field!r} has {count} rows but {num_rows} keys were given")
    if count == 0:
        raise DataPlaneError(f"field {field!r} has no rows, so its dtype and shape are unknown")
    first = rows[0]
    # one C-level pass per property over all rows (about 0.1 us a row in all), not a Python loop per row
    if set(map(type, rows)) != _PLAIN_TENSOR and not all(isinstance(row, torch.Tensor) for row in rows):
        _raise_bad_row(field, rows)
    dtype = first.dtype
    if len(set(map(_DTYPE, rows))) != 1:
        _raise_bad_row(field, rows)
    if first.is_nested or first.layout is not torch.strided:
        raise DataPlaneError(f"field {field!r}: rows must be plain dense tensors, got layout {first.layout}")
    ndim = first.dim()
    try:
        with torch.no_grad():
            if ndim == 0:
                if set(map(torch.Tensor.dim, rows)) != {0}:
                    _raise_shape(field, [row.shape for row in rows], "0-d (per-row scalars)")
                return PackedRows(_to_cpu(torch.stack(list(rows))), None)
            lengths = list(map(_LENGTH, rows))  # TypeError for a 0-d row
            if ndim > 1:  # torch.cat skips 1-D empty inputs, so check trailing dims here; it checks the rest
                tail = first.shape[1:]
                if any(row.dim() != ndim or row.shape[1:] != tail for row in rows):
                    _raise_shape(field, [row.shape for row in rows], f"(*, {', '.join(map(str, tail))})")
            out = None
            if allocate is not None and first.device.type == "cpu":
                out = allocate(dtype, (sum(lengths), *first.shape[1:]))
            values = concat(rows, out)
            if values.dim() != ndim:  # 1-D empty rows next to a row of more dims: cat skipped them
                raise RuntimeError("rows of different dims")
    except (RuntimeError, TypeError) as exc:  # a row of other dims, or rows on different devices
        if isinstance(exc, DataPlaneError):
            raise
        shapes = [row.shape for row in rows]
        _raise_shape(field, shapes, "1-D" if ndim == 1 else f"(*, {', '.join(map(str, first.shape[1:]))})")
        raise DataPlaneError(f"field {field!r}: cannot pack rows: {exc}") from exc
    return PackedRows(_to_cpu(values), lengths)


def _pack_tensor(field: str, column: torch.Tensor, num_rows: int | None, allocate: Allocate | None) -> PackedRows:
    """A packed column (dense ``(N, ...)`` or jagged nested): one bulk copy, no per-row work in Python."""
    with torch._C.DisableTorchFunctionSubclass():  # a jagged tensor's is_nested costs 5 us otherwise
        nested = column.is_nested
    lengths: list[int] | None
    if nested:
        # only a jagged-layout tensor has _ragged_idx (its layout would cost 3 us to ask, its values() 16 us)
        if getattr(column, "_ragged_idx", None) != 1 or column.lengths() is not None:
            return pack_rows(field, list(column.unbind()), num_rows, allocate)
        values = getattr(column, "_values", None)  # the buffer itself, as values() returns it
        values = values if isinstance(values, torch.Tensor) else column.values()
        offsets = column.offsets()
        last = offsets.shape[0] - 1
        start, end = offsets[::last].tolist() if last > 0 else [offsets[0].item()] * 2  # one op for both ends
        if start != 0 or end != values.shape[0]:
            values = values[start:end]
        lengths = offsets.diff().tolist()  # one tensor op, not a Python step per row
    elif column.dim() == 0:
        raise DataPlaneError(f"field {field!r}: a 0-d tensor is not a column; give one tensor per row")
    else:
        values = column
        lengths = None if column.dim() == 1 else [column.shape[1]] * column.shape[0]
        values = values if lengths is None else values.flatten(0, 1)
    count = values.shape[0] if lengths is None else len(lengths)
    if num_rows is not None and count != num_rows:
        raise DataPlaneError(f"field {field!r} has {count} rows but {num_rows} keys were given")
    if values.requires_grad:  # the stored copy must not join the caller's autograd graph
        values = values.detach()
    if allocate is None or not values.is_cpu:
        return PackedRows(_to_cpu(values.clone(memory_format=torch.contiguous_format)), lengths)
    return PackedRows(allocate(values.dtype, values.shape).copy_(values), lengths)


def _to_cpu(values: torch.Tensor) -> torch.Tensor:
    return values if values.device.type == "cpu" else values.cpu()


def _raise_bad_row(field: str, rows: Sequence[Any]) -> None:
    dtype = rows[0].dtype if isinstance(rows[0], torch.Tensor) else None
    for index, row in enumerate(rows):
        if not isinstance(row, torch.Tensor):
            raise DataPlaneError(
                f"field {field!r}: row {index} is a {type(row).__name__}, not a tensor; "
                "the data plane stores tensors only (put strings and other objects in tags)"
            )
        if row.dtype is not dtype:
            raise DataPlaneError(f"field {field!r}: row {index} has dtype {row.dtype} but row 0 has {dtype}")


def _raise_shape(field: str, shapes: Sequence[torch.Size], expected: str) -> None:
    ndim, tail = len(shapes[0]), shapes[0][1:]
    for index, shape in enumerate(shapes):
        if len(shape) != ndim or shape[1:] != tail:
            raise DataPlaneError(
                f"field {field!r}: row {index} has shape {tuple(shape)} but row 0 has {tuple(shapes[0])}; "
                f"rows of a field must all be {expected} (only the first dim may differ)"
            )


def row_lengths(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """First-dim length of each row as an int64 ``(B,)`` tensor; DataPlaneError for 0-d rows or non-tensors."""
    lengths = []
    for index, row in enumerate(rows):
        if not isinstance(row, torch.Tensor) or row.dim() == 0:
            what = type(row).__name__ if not isinstance(row, torch.Tensor) else "0-d tensor"
            raise DataPlaneError(f"row {index} is a {what}; row_lengths needs tensors of one or more dims")
        lengths.append(row.shape[0])
    return torch.tensor(lengths, dtype=torch.int64)
