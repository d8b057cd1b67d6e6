"""TransferQueueDataPlane: the data plane over TransferQueue 0.1.11's KV API with SimpleStorage, on Ray.

The process that builds it first starts (or joins) Ray and starts TransferQueue: a controller actor and
``num_storage_units`` storage actors, each holding one Ray CPU. Any other process attaches to the running
TransferQueue: pickle the object and hand it over (to a Ray actor, say); the copy attaches lazily on first use.
TransferQueue keeps one client per process in module globals, so every instance in a process shares it.

What this wrapper adds to TransferQueue (see docs/data-plane.md, "What sc_lightning adds to TransferQueue"):

- start-up that cannot hang: explicit Ray CPU counts, a check of free CPUs before ``tq.init`` (which otherwise
  waits forever for its actors), and a deadline on ``tq.init`` (``ray.init`` has time-outs of its own);
- ``TQ_NUM_THREADS`` set to the core count before TransferQueue is imported (also for actors of a Ray we start);
- one run per controller: at start, a controller of another Ray job (a run killed a moment ago) is let go first;
  one that stays is a live run's, a clear error;
- strict reads: TransferQueue drops unknown keys and returns nothing for a field some rows lack; we raise
  MissingRowsError naming them (:mod:`~sc_lightning.data_plane.tq_strict`);
- a failed put removes the rows it registered but could not fill, so no orphan rows remain;
- rows come back in our column form (same dtypes and jagged lengths, per-row scalars as 0-d tensors).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import torch

from sc_lightning.data_plane.base import Columns, DataPlaneError
from sc_lightning.data_plane.checks import check_fields, check_keys, check_tags
from sc_lightning.data_plane.codec import BufferPool, PackedRows, pack_rows
from sc_lightning.data_plane.migrations import upgrade_rows
from sc_lightning.data_plane.snapshot_files import read_manifest, read_rows_snapshot, write_manifest
from sc_lightning.data_plane.tq_runtime import (
    NATIVE_DIR,
    WIRE_POOL_BYTES,
    check_ray_cpus,
    controller_exists,
    cpu_cores,
    enable_ray_token_auth,
    foreign_controller_job,
    import_tq,
    kill_controller,
    ray_token_auth_enabled,
    run_with_deadline,
    tq_ray_runtime_env,
    tq_thread_env,
)
from sc_lightning.data_plane.tq_strict import empty_rows, existing_keys, raise_missing, remove_quietly
from sc_lightning.data_plane.wire import from_wire, packed_to_wire, to_wire
from sc_lightning.local_ray import init_local_ray

log = logging.getLogger(__name__)
_T = TypeVar("_T")
FOREIGN_CONTROLLER_WAIT_S = 30.0
"""Longest wait at start for Ray to remove another job's TransferQueue controller (a killed run's goes in ~1 s)."""


class TransferQueueDataPlane:
    """Data plane over TransferQueue (SimpleStorage on Ray); picklable, the copy attaches to the running TQ."""

    def __init__(
        self,
        partition_id: str = "rollout_data",
        *,
        storage_capacity: int | None = 100_000,
        num_storage_units: int = 1,
        start_timeout_s: float = 120.0,
        read_timeout_s: float = 1200.0,
        ray_num_cpus: int | None = None,
    ) -> None:
        """Start or join Ray and TransferQueue now.

        Args:
            partition_id: TransferQueue partition that holds this data plane's rows.
            storage_capacity: Rows all storage units hold together (None = unlimited); used only when this call
                starts TransferQueue (an attaching process gets the running one's settings).
            num_storage_units: Storage actors to start (one Ray CPU each).
            start_timeout_s: Deadline for starting or joining Ray and TransferQueue.
            read_timeout_s: Deadline of one read (``get``, ``tags``): TransferQueue's own calls wait without one,
                forever if its controller actor dies or hangs.
            ray_num_cpus: Logical CPUs of a local Ray this call starts (default: cores + 1 + num_storage_units, so
                TransferQueue's mostly idle actors do not take the CPUs the rest of the program schedules on).
        """
        if num_storage_units < 1:
            raise DataPlaneError(f"num_storage_units must be at least 1, got {num_storage_units}")
        if storage_capacity is not None and storage_capacity < 1:
            raise DataPlaneError(f"storage_capacity must be at least 1 row, got {storage_capacity}")
        self.partition_id = partition_id
        self.storage_capacity = storage_capacity
        self.num_storage_units = num_storage_units
        self.start_timeout_s = start_timeout_s
        self.read_timeout_s = read_timeout_s
        self.ray_num_cpus = ray_num_cpus
        self.ray_address: str | None = None  # on a copy: the owner's Ray cluster, which it joins
        self.ray_token_auth = False  # on a copy: whether the owner's cluster checks Ray's auth token
        self._reset_process_state()
        self._start()

    def _reset_process_state(self) -> None:
        self._pool = BufferPool(WIRE_POOL_BYTES)  # wire buffers, reused put after put
        self._tq: ModuleType | None = None
        self._owns_tq = False
        self._owns_ray = False
        self._closed = False
        self._attach_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "partition_id": self.partition_id,
            "storage_capacity": self.storage_capacity,
            "num_storage_units": self.num_storage_units,
            "start_timeout_s": self.start_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "ray_num_cpus": self.ray_num_cpus,
            "ray_address": self._ray_address(),
            "ray_token_auth": ray_token_auth_enabled(),
        }

    @staticmethod
    def _ray_address() -> str | None:
        """The Ray cluster this process is connected to (where a copy handed to a plain process attaches)."""
        import ray

        return ray.get_runtime_context().gcs_address if ray.is_initialized() else None

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def __repr__(self) -> str:
        role = "owner" if self._owns_tq else "attached" if self._tq is not None else "detached"
        return f"TransferQueueDataPlane(partition_id={self.partition_id!r}, {role})"

    @property
    def owns_transfer_queue(self) -> bool:
        """Whether this object started TransferQueue (its ``close`` then shuts TransferQueue down)."""
        return self._owns_tq

    # ---- data operations -------------------------------------------------------------------------------------

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
        if count == 0:
            for field, rows in (fields or {}).items():
                if len(rows) != 0:
                    raise DataPlaneError(f"field {field!r} has {len(rows)} rows but 0 keys were given")
            return
        wire = to_wire(fields, count, self._pool.allocate) if fields else None
        if wire is None and tag_copies is None:
            tag_copies = [{} for _ in keys]  # a put of bare keys still creates the rows
        tq = self._ensure()
        try:
            tq.kv_batch_put(keys=keys, partition_id=self.partition_id, fields=wire, tags=tag_copies)
        except Exception as exc:
            raise DataPlaneError(
                f"put of {count} rows into partition {self.partition_id!r} failed: {exc}; "
                f"{remove_quietly(tq, self.partition_id, empty_rows(tq, self.partition_id, keys))}"
            ) from exc
        if wire is not None:  # the storage units hold their own copies now
            for value in wire.values():
                self._pool.recycle(value.values() if value.is_nested else value)

    def get(self, keys: Sequence[str], fields: Sequence[str]) -> dict[str, list[torch.Tensor]]:
        """Read ``fields`` of ``keys`` (copies, in key order); MissingRowsError on any unknown key or field."""
        keys = check_keys(keys)
        fields = check_fields(fields)
        tq = self._ensure()
        if not keys:
            return {field: [] for field in fields}
        if not fields:
            if existing_keys(tq, self.partition_id, keys) != set(keys):
                raise_missing(tq, self.partition_id, keys, fields)
            return {}
        try:
            wire = self._read(
                lambda: tq.kv_batch_get(keys=keys, partition_id=self.partition_id, select_fields=fields),
                f"a get of {len(keys)} rows",
            )
        except ValueError:  # "keys or partition were not found" / "Some fields are not ready"
            wire = None
        except DataPlaneError:  # past the read's deadline: it says so itself
            raise
        except Exception as exc:
            raise self._failed(f"get of {len(keys)} rows", exc) from exc
        if wire is None or wire.batch_size[0] != len(keys) or not set(fields) <= set(wire.keys()):
            raise_missing(tq, self.partition_id, keys, fields)
        return from_wire(wire, fields)

    def get_packed(self, keys: Sequence[str], fields: Sequence[str]) -> dict[str, PackedRows]:
        """Like ``get``, each field packed into one buffer (TransferQueue hands back rows, so this packs them)."""
        return {field: pack_rows(field, rows) for field, rows in self.get(keys, fields).items()}

    def tags(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The merged tags of each key, in key order; MissingRowsError on unknown keys."""
        keys = check_keys(keys)
        tq = self._ensure()
        if not keys:
            return []
        try:
            meta = self._read(
                lambda: tq.get_client().kv_retrieve_meta(keys=keys, partition_id=self.partition_id, create=False),
                f"the tags of {len(keys)} rows",
            )
        except DataPlaneError:
            raise
        except Exception as exc:
            raise self._failed(f"tags of {len(keys)} rows", exc) from exc
        if meta.size != len(keys):
            raise_missing(tq, self.partition_id, keys, [])
        return [dict(tag) for tag in meta.custom_meta]

    def keys(self) -> list[str]:
        """Every stored key."""
        tq = self._ensure()
        try:
            return list(tq.kv_list(partition_id=self.partition_id).get(self.partition_id, {}))
        except Exception as exc:
            raise self._failed("listing keys", exc) from exc

    def clear(self, keys: Sequence[str]) -> None:
        """Delete rows; unknown keys are ignored, so clearing twice is harmless."""
        keys = list(dict.fromkeys(check_keys(keys, unique=False)))
        tq = self._ensure()
        if keys:
            try:
                tq.kv_clear(keys=keys, partition_id=self.partition_id)
            except Exception as exc:
                raise self._failed(f"clear of {len(keys)} rows", exc) from exc

    # ---- snapshots -------------------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> None:
        """Write TransferQueue's native checkpoint (every partition) into ``directory/transfer_queue``.

        Call it only when no put or clear is in flight (TransferQueue saves the controller, then the storage).
        """
        tq = self._ensure()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        rows = len(self.keys())
        try:
            tq.save_checkpoint(directory / NATIVE_DIR, metadata={"partition_id": self.partition_id, "rows": rows})
        except Exception as exc:
            raise self._failed(f"saving a snapshot into {directory}", exc) from exc
        write_manifest(directory, backend="simple", partition_id=self.partition_id, rows=rows)

    def load(self, directory: str | Path) -> None:
        """Replace the contents with a snapshot: TransferQueue's native one, or a memory backend's neutral one.

        A native load replaces every partition of the running TransferQueue (it restores the whole controller
        and storage) and needs the same number of storage units. A neutral snapshot is re-put into this
        partition after its current rows are cleared; if that fails midway the partition is left empty. Rows of an
        older snapshot version are then upgraded (:func:`~sc_lightning.data_plane.migrations.upgrade_rows`).
        """
        tq = self._ensure()
        directory = Path(directory)
        manifest = read_manifest(directory, self.partition_id)
        if manifest["backend"] == "simple":
            try:
                tq.load_checkpoint(directory / NATIVE_DIR)
            except (ValueError, FileNotFoundError, RuntimeError) as exc:
                raise DataPlaneError(f"could not load the TransferQueue checkpoint in {directory}: {exc}") from exc
        else:
            self._load_neutral(tq, directory)
        upgrade_rows(self, manifest["version"], directory)

    def _load_neutral(self, tq: ModuleType, directory: Path) -> None:
        from tensordict import TensorDict

        state = read_rows_snapshot(directory, self.partition_id)
        self.clear(self.keys())
        keys = state["keys"]
        try:
            if keys:
                tq.kv_batch_put(keys=keys, partition_id=self.partition_id, tags=[dict(t) for t in state["tags"]])
            for field, data in state["fields"].items():
                lengths = None if data["lengths"] is None else data["lengths"].tolist()
                field_keys = [keys[row] for row in data["rows"].tolist()]
                wire = TensorDict(
                    {field: packed_to_wire(PackedRows(data["values"], lengths))}, batch_size=[len(field_keys)]
                )
                tq.kv_batch_put(keys=field_keys, partition_id=self.partition_id, fields=wire)
        except Exception as exc:
            raise DataPlaneError(
                f"loading the snapshot in {directory} failed: {exc}; {remove_quietly(tq, self.partition_id, keys)}"
            ) from exc

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut TransferQueue (and a Ray it started) down if this object started them; idempotent.

        In any other process (or a second instance in the starting one) this only stops using TransferQueue:
        the process-global TransferQueue client stays attached until the process exits.
        """
        if self._closed:
            return
        self._closed = True
        self._pool.clear()
        tq, self._tq = self._tq, None
        if self._owns_tq and tq is not None:
            try:
                tq.close()
            except Exception as exc:  # closing must not mask the error that led here
                log.warning("TransferQueue did not shut down cleanly: %s", exc)
        if self._owns_ray:
            import ray

            ray.shutdown()

    def _start(self) -> None:
        """Start or join Ray, then start or attach to TransferQueue (within ``start_timeout_s``)."""
        env = tq_thread_env()
        import ray

        if not ray.is_initialized():
            self._init_ray(ray, env)
        try:
            tq = import_tq()
            self._wait_for_foreign_controller(ray)
            if controller_exists(ray):
                self._deadline(tq.init, "attaching to the running TransferQueue")
            else:
                check_ray_cpus(ray.available_resources(), 1 + self.num_storage_units)
                try:
                    self._deadline(lambda: tq.init(self._tq_config()), "starting TransferQueue")
                except DataPlaneError:
                    kill_controller(ray)
                    raise
                self._owns_tq = True
            self._tq = tq
        except BaseException:
            if self._owns_ray:
                ray.shutdown()
            raise

    def _wait_for_foreign_controller(self, ray: ModuleType) -> None:
        """Let Ray remove the controller of another job (a run killed a moment ago on a long-lived cluster) before
        starting ours; within ``start_timeout_s`` (at most 30 s), else a live run holds it: a DataPlaneError.

        TransferQueue keeps one controller per cluster under a fixed name, so attaching to another job's would mix
        two runs' rows, or fail once Ray reaps it.
        """
        wait_s = min(self.start_timeout_s, FOREIGN_CONTROLLER_WAIT_S)
        deadline = time.monotonic() + wait_s
        while (job := foreign_controller_job(ray)) is not None:
            if time.monotonic() > deadline:
                raise DataPlaneError(
                    f"the TransferQueue controller of Ray job {job} still runs on this cluster after "
                    f"{wait_s:g} s: TransferQueue runs one per "
                    "cluster, so two runs cannot share it; stop the other run, or give this one its own cluster "
                    "(unset RAY_ADDRESS)"
                )
            time.sleep(0.2)

    def _init_ray(self, ray: ModuleType, env: dict[str, str]) -> None:
        # ray.init runs in this thread, not under run_with_deadline: Ray ties the processes it spawns to the
        # spawning thread's life (parent-death signal), and it has start-up timeouts of its own.
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, runtime_env=tq_ray_runtime_env(env))
            return
        num_cpus = self.ray_num_cpus or cpu_cores() + 1 + self.num_storage_units
        init_local_ray(num_cpus, runtime_env=tq_ray_runtime_env(env))
        self._owns_ray = True

    def _tq_config(self) -> dict[str, Any]:
        return {
            "controller": {"polling_mode": True},  # never block the controller's only thread waiting for rows
            "backend": {
                "storage_backend": "SimpleStorage",
                "SimpleStorage": {
                    "num_data_storage_units": self.num_storage_units,
                    "total_storage_size": self.storage_capacity,
                    # TransferQueue pins its storage units round-robin to the cluster's nodes that have this
                    # resource (every alive node without it): not to a node with no CPUs, where one never starts
                    # (a head started with --num-cpus 0, as Ray advises for large clusters)
                    "required_node_resource": "CPU",
                },
            },
        }

    def _ensure(self) -> ModuleType:
        """The attached ``transfer_queue`` module; an unpickled copy attaches here on first use."""
        if self._closed:
            raise DataPlaneError(f"data plane partition {self.partition_id!r} is closed")
        if self._tq is None:
            with self._attach_lock:
                if self._tq is None:
                    self._attach()
        assert self._tq is not None
        return self._tq

    def _attach(self) -> None:
        env = tq_thread_env()
        import ray

        if not ray.is_initialized():  # a plain process (Ray actors are connected already)
            self._join_owner_ray(ray, env)
        if not controller_exists(ray):
            raise DataPlaneError(
                "TransferQueue is not running in this Ray cluster (no TransferQueueController actor); build the "
                "data plane in the driver first and hand this process a pickled copy"
            )
        tq = import_tq()
        self._deadline(tq.init, "attaching to the running TransferQueue")
        self._tq = tq

    def _join_owner_ray(self, ray: ModuleType, env: dict[str, str]) -> None:
        """Join the owner's Ray cluster by its address (``RAY_ADDRESS`` wins), with the owner's auth mode."""
        address = os.environ.get("RAY_ADDRESS") or self.ray_address or "auto"
        if self.ray_token_auth:
            enable_ray_token_auth()  # Ray checks tokens only where told to when it joins by address
        ray.init(address=address, runtime_env=tq_ray_runtime_env(env))
        joined = ray.get_runtime_context().gcs_address
        if self.ray_address is not None and joined != self.ray_address:
            raise DataPlaneError(
                f"this process joined the Ray cluster at {joined} (RAY_ADDRESS={address}), but the data plane lives "
                f"in the one at {self.ray_address}: unset RAY_ADDRESS or set it to {self.ray_address}"
            )

    def _deadline(self, fn: Callable[[], _T], what: str) -> _T:
        return run_with_deadline(fn, self.start_timeout_s, what)

    def _read(self, fn: Callable[[], _T], what: str) -> _T:
        """``fn`` (a TransferQueue read) within :attr:`read_timeout_s`, else a DataPlaneError naming the read."""
        return run_with_deadline(fn, self.read_timeout_s, f"{what} from TransferQueue partition {self.partition_id!r}")

    def _failed(self, what: str, exc: Exception) -> DataPlaneError:
        return DataPlaneError(f"{what} in TransferQueue partition {self.partition_id!r} failed: {exc}")
