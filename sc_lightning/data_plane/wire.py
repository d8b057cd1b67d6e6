"""Packed rows <-> TransferQueue's wire form.

Wire form (what TransferQueue's KV API takes and returns): a TensorDict whose scalar fields are dense ``(N,)``
tensors and whose other fields are ``torch.nested`` jagged tensors. TransferQueue returns every field of one or more
dims per row as jagged, even uniform ones; ``from_wire`` turns any of these back into column form.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from sc_lightning.data_plane.base import Columns, DataPlaneError
from sc_lightning.data_plane.codec import Allocate, PackedRows, pack_rows

if TYPE_CHECKING:
    from tensordict import TensorDict


def to_wire(columns: Columns, num_rows: int, allocate: Allocate | None = None) -> TensorDict:
    """Columns -> TransferQueue's wire TensorDict: scalar fields dense ``(N,)``, others jagged nested tensors."""
    from tensordict import TensorDict

    wire: dict[str, torch.Tensor] = {}
    for field, rows in columns.items():
        if not isinstance(field, str):
            raise DataPlaneError(f"field names must be strings, got {field!r}")
        packed = pack_rows(field, rows, num_rows, allocate)
        wire[field] = packed_to_wire(packed)
    return TensorDict(wire, batch_size=[num_rows])


def packed_to_wire(packed: PackedRows) -> torch.Tensor:
    """One packed field as a wire tensor: the ``(N,)`` values for scalars, else a jagged nested tensor."""
    if packed.lengths is None:
        return packed.values
    offsets = torch.tensor(packed.offsets(), dtype=torch.int64)
    return torch.nested.nested_tensor_from_jagged(packed.values, offsets=offsets)


def from_wire(wire: Mapping[str, Any], fields: Sequence[str] | None = None) -> dict[str, list[torch.Tensor]]:
    """Wire TensorDict (as TransferQueue returns it) -> columns; rows are views of the returned buffers."""
    names = list(wire.keys()) if fields is None else list(fields)
    return {field: wire_to_rows(field, wire[field]) for field in names}


def wire_to_rows(field: str, value: Any) -> list[torch.Tensor]:
    """One wire field as per-row tensors: jagged nested -> its components, dense ``(N, ...)`` -> its rows."""
    if not isinstance(value, torch.Tensor):
        raise DataPlaneError(f"field {field!r} came back as a {type(value).__name__}, not a tensor")
    if not value.is_nested:
        return list(value.unbind(0))
    if value.layout is torch.jagged and value.lengths() is None:
        bounds = value.offsets().tolist()
        values = value.values().detach()  # splitting the view values() returns costs 3x more per row
        if bounds[0] != 0 or bounds[-1] != values.shape[0]:
            values = values[bounds[0] : bounds[-1]]
        return list(values.split([end - start for start, end in itertools.pairwise(bounds)]))
    return list(value.unbind())
