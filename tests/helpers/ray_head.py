"""One Ray cluster per test process that the suite's runs join by address, instead of each starting its own.

Starting a local Ray instance costs ~10 CPU seconds on the 2-core box (GCS, raylet, dashboard, agents, each a
process importing Ray) and the suite's runs started dozens; joining a running one costs 2-4. The head runs as
``ray start --head --block`` (ending it ends its processes) with token authentication, as Ray's local instances have
by default: its token and ``RAY_AUTH_MODE=token`` (:attr:`RayHead.auth_env`) go into the environment beside
``RAY_ADDRESS``, so every process of the tests, a local instance a test starts itself included, sends and checks the
same token (a process in token mode and a cluster without it refuse each other's calls). A run on it behaves as a run
on a user's cluster does (the engines' and data plane's actors are the run's job's, and go with its driver).

Workers of a joined cluster are started by its raylet with the raylet's environment, not the driver's: a test whose
actors must see variables set for that one run, or that checks what a run's own local Ray does, drops
``RAY_ADDRESS`` from the child's environment (``user_environment(without=("RAY_ADDRESS",))``), or starts Ray in
:func:`own_local_ray`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sc_lightning.local_ray import LOCAL_RAY_SYSTEM_CONFIG
from tests.helpers.ports import free_port

RAY_ADDRESS = "RAY_ADDRESS"
READY_LINE = "Ray runtime started"
START_DEADLINE_S = 120.0
_HEAD_SESSIONS: set[int] = set()


class RayHead:
    """A local Ray head node in its own process group, started by ``ray start --head --block`` (or, joining another
    head, a second node of its cluster, started by ``ray start --address --block``)."""

    def __init__(self, temp_dir: Path, *, num_cpus: int, join: RayHead | None = None) -> None:
        """Start the head with ``num_cpus`` logical CPUs, its session files and output under ``temp_dir``; with
        ``join``, a node of ``join``'s cluster instead (its address, token and session files; its output under
        ``temp_dir``, which :meth:`stop` then leaves to ``join``).

        Not under Ray's default ``/tmp/ray``: ``ray start`` records its address there, and every later ``ray.init()``
        on the machine without an address, a test's own local instance included, would join it.
        """
        self.temp_dir, self.joined = temp_dir, join is not None
        self.auth_env = (
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)} if join is None else join.auth_env
        )
        """Token authentication's settings, for the head and every process that joins it."""
        self.log_path = temp_dir / ("ray-head.log" if join is None else f"ray-node-{secrets.token_hex(4)}.log")
        self.address = f"127.0.0.1:{free_port()}" if join is None else join.address
        ray_cli = Path(sys.executable).parent / "ray"
        if join is None:
            role = [
                "--head",
                f"--port={self.address.rpartition(':')[2]}",
                f"--temp-dir={temp_dir}",
                "--include-dashboard=false",
                "--system-config=" + json.dumps(LOCAL_RAY_SYSTEM_CONFIG),  # as sc_lightning's own local instances
            ]
        else:
            role = [f"--address={self.address}", f"--temp-dir={join.temp_dir}"]
        command = [str(ray_cli), "start", "--block", *role, f"--num-cpus={num_cpus}", "--disable-usage-stats"]
        env = {k: v for k, v in os.environ.items() if k != RAY_ADDRESS} | self.auth_env
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        _HEAD_SESSIONS.add(self.process.pid)  # its own session: every process of the cluster is in it

    def wait_ready(self) -> None:
        """Return once the head reports its processes started; RuntimeError with its output if it ends or stalls."""
        deadline = time.monotonic() + START_DEADLINE_S
        while READY_LINE not in self.log_path.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the tests' Ray head did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        """End the head and every process it started (``ray start --block`` stops them on SIGTERM); remove its
        session files (a joined node: its head's, which the head removes)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        if not self.joined:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def in_shared_cluster(pid: int) -> bool:
    """Whether process ``pid`` belongs to a shared head this process started (its GCS, raylet, workers)."""
    try:
        return os.getsid(pid) in _HEAD_SESSIONS
    except ProcessLookupError:
        return False


def connect_ray(num_cpus: int, **options: Any) -> None:
    """Connect this process to Ray: join the cluster ``RAY_ADDRESS`` names, or without one start a local instance
    of ``num_cpus`` logical CPUs; ``options`` go to ``ray.init``."""
    import ray

    from sc_lightning.local_ray import init_local_ray

    if os.environ.get(RAY_ADDRESS):
        ray.init(address=os.environ[RAY_ADDRESS], **options)
    else:
        init_local_ray(num_cpus, **options)


@contextmanager
def own_local_ray() -> Iterator[None]:
    """Within: this process's Ray starts are its own local instances, as a user's without ``RAY_ADDRESS`` are."""
    address = os.environ.pop(RAY_ADDRESS, None)
    try:
        yield
    finally:
        if address is not None:
            os.environ[RAY_ADDRESS] = address
