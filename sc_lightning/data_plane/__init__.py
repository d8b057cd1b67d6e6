"""The data plane: rows of tensors by key between the rollout and train pumps (contract in ``base``).

``build_data_plane`` picks the backend from the config: ``memory`` (in-process, ``MemoryDataPlane``) or
``simple`` (TransferQueue SimpleStorage on Ray, ``TransferQueueDataPlane``). Backends are imported lazily, so
importing this package never imports Ray or TransferQueue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sc_lightning.data_plane.base import Columns, DataPlane, DataPlaneError, MissingRowsError

if TYPE_CHECKING:
    from sc_lightning.config.runtime import DataPlaneConfig
    from sc_lightning.data_plane.memory import MemoryDataPlane
    from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

__all__ = [
    "Columns",
    "DataPlane",
    "DataPlaneError",
    "MemoryDataPlane",
    "MissingRowsError",
    "TransferQueueDataPlane",
    "build_data_plane",
]


def build_data_plane(cfg: DataPlaneConfig, *, read_timeout_s: float | None = None) -> DataPlane:
    """The configured backend, bound to ``cfg.partition_id``; the ``simple`` one starts or joins TransferQueue, its
    reads bounded by ``read_timeout_s`` (None: its default; the in-process one's reads cannot hang)."""
    if not cfg.enabled:
        raise DataPlaneError("data_plane.enabled is false, but the Single-Controller path needs a data plane")
    if cfg.backend == "memory":
        from sc_lightning.data_plane.memory import MemoryDataPlane

        return MemoryDataPlane(partition_id=cfg.partition_id, capacity=cfg.storage_capacity)
    if cfg.backend == "simple":
        from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

        return TransferQueueDataPlane(
            partition_id=cfg.partition_id,
            storage_capacity=cfg.storage_capacity,
            num_storage_units=cfg.num_storage_units,
            **({} if read_timeout_s is None else {"read_timeout_s": read_timeout_s}),
        )
    raise DataPlaneError(f"unknown data_plane.backend {cfg.backend!r}; choose 'simple' or 'memory'")


def __getattr__(name: str) -> Any:
    """Import a backend class on first access (``from sc_lightning.data_plane import MemoryDataPlane``)."""
    if name == "MemoryDataPlane":
        from sc_lightning.data_plane.memory import MemoryDataPlane

        return MemoryDataPlane
    if name == "TransferQueueDataPlane":
        from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

        return TransferQueueDataPlane
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
