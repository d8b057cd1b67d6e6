"""The data-plane contract: rows of tensors stored by key, read back strictly, cleared, and snapshotted.

A data plane holds one partition of rows. Each row has a string key, any number of named fields (one tensor per
row and field; per-token fields are 1-D and jagged across rows) and a dict of primitive tags. The rollout pump
writes a group's rows once; later stages add fields to the same keys (column write-back); the trainer reads
them by key with an explicit field list; consumed rows are cleared. Every backend behaves identically; the
contract tests in ``tests/data_plane`` run against all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from sc_lightning.data_plane.codec import PackedRows

Columns = Mapping[str, Sequence[torch.Tensor]]
"""Field name -> one tensor per row, in key order."""


class DataPlaneError(RuntimeError):
    """A data-plane operation failed; the message names the keys and fields involved."""


class MissingRowsError(DataPlaneError, KeyError):
    """A read named keys that are not stored, or fields that some requested rows do not have."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@runtime_checkable
class DataPlane(Protocol):
    """Rows of tensors by key: put, strict get, tags, clear, snapshot save/load."""

    partition_id: str

    def put(
        self,
        keys: Sequence[str],
        fields: Columns | None = None,
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Create or update rows: write each field (copied) and merge each row's tags; all-or-nothing."""

    def get(self, keys: Sequence[str], fields: Sequence[str]) -> dict[str, list[torch.Tensor]]:
        """Read ``fields`` of ``keys`` (copies, in key order); MissingRowsError on any unknown key or field."""

    def get_packed(self, keys: Sequence[str], fields: Sequence[str]) -> dict[str, PackedRows]:
        """Like ``get``, but each field comes back as one buffer of its rows plus their lengths (no row tensors)."""

    def tags(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The merged tags of each key, in key order; MissingRowsError on unknown keys."""

    def keys(self) -> list[str]:
        """Every stored key."""

    def clear(self, keys: Sequence[str]) -> None:
        """Delete rows; unknown keys are ignored, so clearing twice is harmless."""

    def save(self, directory: str | Path) -> None:
        """Write a snapshot of every row (fields and tags) into ``directory``."""

    def load(self, directory: str | Path) -> None:
        """Replace the contents with a snapshot written by ``save``."""

    def close(self) -> None:
        """Release the backend's resources; idempotent."""


def pad_rows(rows: Sequence[torch.Tensor], pad_value: float | int | bool = 0) -> torch.Tensor:
    """Jagged rows -> one ``(B, T_max, *trailing)`` tensor, ``pad_value`` after each row's end; scalars -> ``(B,)``.

    How a reader turns the rows a ``get`` returns into a batch; the rows are checked as ``put`` checks them.
    """
    from sc_lightning.data_plane.codec import pack_rows  # codec builds on this module: imported at call time

    packed = pack_rows("rows", rows)
    if packed.lengths is None:
        return packed.values
    lengths = torch.tensor(packed.lengths, dtype=torch.int64)
    longest = max(packed.lengths)
    out = packed.values.new_full((len(packed.lengths), longest, *packed.values.shape[1:]), pad_value)
    mask = torch.arange(longest) < lengths[:, None]  # (B, T_max): True where a row has a value
    out[mask] = packed.values
    return out
