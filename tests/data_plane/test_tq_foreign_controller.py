"""Two runs on one long-lived Ray cluster: a data plane never attaches to another Ray job's TransferQueue controller.

TransferQueue keeps one controller per cluster under a fixed name. Here a child process (its own Ray job, joined by
address like a run under ``RAY_ADDRESS``) starts TransferQueue and holds it; this test process (another job on the
same cluster) then starts a data plane: it must refuse the live run's controller, and once that run is killed with
SIGKILL, start its own in place of the dead run's (which Ray removes moments after the kill).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from sc_lightning.data_plane.base import DataPlaneError
from tests.helpers.configs import REPO
from tests.helpers.ray_head import connect_ray

pytestmark = pytest.mark.slow

OTHER_RUN = """
import sys, time
from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane
plane = TransferQueueDataPlane("other-run", storage_capacity=16)
assert plane.owns_transfer_queue
print("ready", flush=True)
sys.stdin.read()  # held until the test kills this process
"""


@pytest.fixture
def cluster() -> Iterator[str]:
    """The tests' shared Ray cluster, or a local one with room for two TransferQueues; its address."""
    import ray

    assert not ray.is_initialized(), "another module left Ray running"
    connect_ray(6, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_a_live_runs_controller_is_refused_and_a_killed_runs_is_replaced(cluster: str) -> None:
    from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_RUN],
        env={**os.environ, "RAY_ADDRESS": cluster},
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == "ready"
        with pytest.raises(DataPlaneError, match=r"controller of Ray job \w+ still runs on this cluster after 3 s"):
            TransferQueueDataPlane("this-run", storage_capacity=16, start_timeout_s=3)
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait(timeout=30)
    plane = TransferQueueDataPlane("this-run", storage_capacity=16)  # right after the kill: Ray may still hold it
    try:
        assert plane.owns_transfer_queue
        plane.put(["a"], {"ids": [torch.arange(3, dtype=torch.int32)]})
        assert plane.get(["a"], ["ids"])["ids"][0].tolist() == [0, 1, 2]
    finally:
        plane.close()
