"""How sc_lightning starts a local Ray instance (when no ``RAY_ADDRESS`` names a cluster to join).

No dashboard, and no worker processes started ahead of need: by default Ray's node starts as many idle Python
workers as it has CPUs when the first driver connects, each importing Ray (about a CPU second apiece on the 2-core
box, 128 of them on a 128-core node), while sc_lightning's actors (engines, TransferQueue) start their own worker
processes anyway. Workers run at the driver's priority: Ray renices its workers to 15 by default, so on a busy box
(a test suite's other worker, a second run) the actors a run waits for (its engine, TransferQueue's controller and
storage) get a few percent of a core, and a start that takes 4 s alone took 60 s beside two busy processes.
Stdlib only, imported where Ray is started.
"""

from __future__ import annotations

import sys
from typing import Any

LOCAL_RAY_SYSTEM_CONFIG = {"prestart_worker_first_driver": False, "worker_niceness": 0}
"""Ray's system settings for the local instances sc_lightning starts (no idle workers started ahead of need; workers
not reniced below the driver)."""


def init_local_ray(num_cpus: int, **options: Any) -> None:
    """``ray.init`` of a new local instance with ``num_cpus`` logical CPUs; ``options`` go to ``ray.init``."""
    import ray

    ray.init(num_cpus=num_cpus, include_dashboard=False, _system_config=LOCAL_RAY_SYSTEM_CONFIG, **options)


def ray_connected() -> bool:
    """Whether this process is connected to Ray (started a local instance or joined a cluster); never imports Ray."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def disconnect_ray() -> None:
    """Leave Ray now, if connected: as at interpreter exit (the job's actors end; a local instance this process
    started stops), without the half-second sleep Ray's exit hook takes first for late worker output.

    A command calls it once its work has ended well, for the Ray connection it opened itself; on an error the exit
    hook still runs with its pause, so a failing actor's last words reach the console.
    """
    if ray_connected():
        import ray

        ray.shutdown()
