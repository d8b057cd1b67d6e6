"""Starting and finding TransferQueue on Ray without hanging: CPU checks, thread settings, deadlines.

TransferQueue's ``tq.init`` waits forever when Ray lacks CPUs for its actors, and TransferQueue reads
``TQ_NUM_THREADS`` at import. These helpers make start-up fail fast with a message instead.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, TypeVar

from sc_lightning.data_plane.base import DataPlaneError
from sc_lightning.data_plane.lean_tensordict import SETUP_HOOK, import_tensordict_without_dynamo

log = logging.getLogger(__name__)

CONTROLLER_ACTOR = "TransferQueueController"
"""Name of TransferQueue's controller actor (in Ray namespace ``transfer_queue``); its presence means TQ runs."""
CONTROLLER_NAMESPACE = "transfer_queue"
NATIVE_DIR = "transfer_queue"
"""Sub-directory of a snapshot directory that holds TransferQueue's own checkpoint."""

WIRE_POOL_BYTES = 256 * 2**20
"""Memory kept per process for packing puts into TransferQueue's wire form (buffers are reused, not re-faulted)."""

RAY_AUTH_MODE = "RAY_AUTH_MODE"
"""Ray's switch for token authentication ("token" or "disabled")."""

_T = TypeVar("_T")


def cpu_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def tq_thread_env() -> dict[str, str]:
    """Set ``TQ_NUM_THREADS`` to the core count unless already set (TQ reads it at import); returns it as env."""
    os.environ.setdefault("TQ_NUM_THREADS", str(cpu_cores()))
    return {"TQ_NUM_THREADS": os.environ["TQ_NUM_THREADS"]}


def tq_ray_runtime_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The Ray job settings of a run whose data plane is TransferQueue: ``env`` in every worker, which imports
    tensordict without TorchDynamo at start (:mod:`~sc_lightning.data_plane.lean_tensordict`)."""
    return {"env_vars": dict(env), "worker_process_setup_hook": SETUP_HOOK}


def ray_token_auth_enabled() -> bool:
    """Whether this process's Ray checks auth tokens (``RAY_AUTH_MODE=token``, set by a local ``ray.init``)."""
    return os.environ.get(RAY_AUTH_MODE, "").lower() == "token"


def enable_ray_token_auth() -> None:
    """Make this process send Ray's auth token when it joins a cluster by address.

    Ray 2.60 turns token auth on for every local cluster ``ray.init`` starts, but a process joining by an explicit
    address sends the token only when ``RAY_AUTH_MODE=token``, which Ray reads once at import: set it and let Ray
    re-read its settings (its own helper for exactly this). The token itself comes from where Ray keeps it
    (``~/.ray/auth_token`` or ``RAY_AUTH_TOKEN``).
    """
    if ray_token_auth_enabled():
        return
    from ray._private.authentication.authentication_token_setup import _enable_token_auth

    _enable_token_auth()


def check_ray_cpus(available: Mapping[str, float], needed: int) -> None:
    """DataPlaneError unless ``available`` Ray resources hold ``needed`` CPUs (otherwise ``tq.init`` hangs)."""
    free = available.get("CPU", 0.0)
    if free < needed:
        raise DataPlaneError(
            f"TransferQueue needs {needed} free Ray CPUs (1 controller + {needed - 1} storage unit(s)) but the Ray "
            f"cluster has {free:g} free; start Ray with more logical CPUs (ray.init(num_cpus=...)), lower "
            "data_plane.num_storage_units, or build the data plane before other actors take the CPUs"
        )


def run_with_deadline(fn: Callable[[], _T], timeout_s: float, what: str) -> _T:
    """Run ``fn`` in a daemon thread; DataPlaneError if it has not returned within ``timeout_s``."""
    outcome: dict[str, Any] = {}

    def _target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=_target, name=f"data-plane: {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise DataPlaneError(
            f"{what} did not finish within {timeout_s:g} s; check that Ray has free CPUs for TransferQueue's "
            "actors (ray.available_resources()) and that the Ray cluster is reachable"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def import_tq() -> ModuleType:
    """Import transfer_queue after setting TQ_NUM_THREADS (TransferQueue reads it at import)."""
    tq_thread_env()
    import_tensordict_without_dynamo()
    import transfer_queue

    return transfer_queue


def controller_exists(ray: ModuleType) -> bool:
    """Whether a TransferQueue controller actor is running on this Ray cluster."""
    try:
        ray.get_actor(CONTROLLER_ACTOR, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        return False
    return True


def foreign_controller_job(ray: ModuleType) -> str | None:
    """The Ray job (hex id) of a TransferQueue controller on this cluster that another job started; None when there
    is no controller or this job's own."""
    try:
        handle = ray.get_actor(CONTROLLER_ACTOR, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        return None
    job = handle._ray_actor_id.job_id.hex()  # an actor's id embeds the job that created it
    return None if job == ray.get_runtime_context().get_job_id() else job


def kill_controller(ray: ModuleType) -> None:
    """Best effort: remove a controller left behind by a start that timed out."""
    try:
        ray.kill(ray.get_actor(CONTROLLER_ACTOR, namespace=CONTROLLER_NAMESPACE))
    except Exception as exc:
        log.warning("could not remove the TransferQueue controller of a failed start: %s", exc)
