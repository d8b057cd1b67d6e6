"""Strict reads and clean-up over TransferQueue's lax KV API, for one partition.

TransferQueue drops unknown keys from a read and returns nothing for a field some rows lack, and a failed
``kv_batch_put`` leaves the keys it registered with nothing produced. These helpers find out which rows are stored
or missing, name them in a :class:`~sc_lightning.data_plane.base.MissingRowsError`, and remove the empty rows a
failed write left; :class:`~sc_lightning.data_plane.transfer_queue.TransferQueueDataPlane` calls them. ``tq`` is the
attached ``transfer_queue`` module.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NoReturn

from sc_lightning.data_plane.base import DataPlaneError, MissingRowsError
from sc_lightning.data_plane.checks import missing_message


def existing_keys(tq: ModuleType, partition_id: str, keys: list[str]) -> set[str]:
    """Which of ``keys`` are stored (one controller round trip; two when only some are; TQ logs the rest)."""
    client = tq.get_client()
    meta = client.kv_retrieve_meta(keys=keys, partition_id=partition_id, create=False)
    if meta.size == len(keys):
        return set(keys)
    if meta.size == 0:
        return set()
    return set(client.kv_retrieve_keys(global_indexes=list(meta.global_indexes), partition_id=partition_id))


def raise_missing(tq: ModuleType, partition_id: str, keys: list[str], fields: list[str]) -> NoReturn:
    """MissingRowsError naming the unknown keys and, per field, the known rows that lack it."""
    stored = tq.kv_list(partition_id=partition_id).get(partition_id, {})
    unknown = [key for key in keys if key not in stored]
    known = [key for key in keys if key in stored]
    missing: dict[str, list[str]] = {}
    if known and fields:
        client = tq.get_client()
        meta = client.kv_retrieve_meta(keys=known, partition_id=partition_id, create=False)
        indexes = list(meta.global_indexes)  # aligned with ``known``
        for field in fields:
            produced = _produced(client, field, partition_id)
            absent = [key for key, index in zip(known, indexes, strict=True) if index not in produced]
            if absent:
                missing[field] = absent
    if not unknown and not missing:
        raise DataPlaneError(
            f"TransferQueue returned an incomplete result for {len(keys)} keys and fields {fields} of partition "
            f"{partition_id!r}, although all of them are stored"
        )
    raise MissingRowsError(missing_message(partition_id, unknown, missing))


def empty_rows(tq: ModuleType, partition_id: str, keys: list[str]) -> list[str]:
    """Keys among ``keys`` whose rows hold no field and no tag: the rows a failed put registered.

    TransferQueue registers every key of a put before writing to storage, so after a failure the new keys
    exist with nothing produced. Asked key by key (this runs only after a failure): a query for missing keys
    would make the controller log a warning on every put. A row that existed before with neither fields nor
    tags (a bare ``put(keys)``) looks the same and is removed too.
    """
    client = tq.get_client()
    empty = []
    for key in keys:
        try:
            meta = client.kv_retrieve_meta(keys=[key], partition_id=partition_id, create=False)
        except Exception:  # the controller itself is failing; leave the key alone
            continue
        if meta.size == 1 and not meta.field_names and not meta.custom_meta[0]:
            empty.append(key)
    return empty


def remove_quietly(tq: ModuleType, partition_id: str, keys: list[str]) -> str:
    """Clear ``keys`` after a failed write; returns what happened, for the error message."""
    if not keys:
        return "no row was left empty, so none was removed"
    try:
        tq.kv_clear(keys=keys, partition_id=partition_id)
    except Exception as exc:
        return f"removing the {len(keys)} rows it left empty also failed ({exc}); they may remain as orphans"
    return f"the {len(keys)} rows it left empty were removed"


def _produced(client: Any, field: str, partition_id: str) -> set[int]:
    """Global indexes of the partition's rows that hold ``field`` (empty if the field was never written)."""
    try:
        indexes, status = client.get_production_status(data_fields=[field], partition_id=partition_id)
    except Exception:  # TQ raises for a field it has never seen
        return set()
    if indexes is None or status is None:
        return set()
    ready = status.reshape(len(indexes), -1)[:, 0] == 1
    return set(indexes[ready].tolist())
