"""A pickled TransferQueue data plane handed to a plain process (a trainer rank) joins the owner's Ray cluster.

The child processes get an environment without ``RAY_AUTH_MODE``, like a rank Lightning's launcher starts before the
leader's ``ray.init``: Ray checks auth tokens on every local cluster it starts, and a process joining by address
sends the token only when told to.
"""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.ray_head import own_local_ray

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import base64, pickle, sys
plane = pickle.loads(base64.b64decode(sys.stdin.read()))
if len(sys.argv) > 1:
    plane.ray_address = sys.argv[1]  # pretend the owner lives elsewhere
rows = plane.get(["a", "b"], ["ids"])["ids"]
print([row.tolist() for row in rows])
plane.close()
"""


@pytest.fixture(scope="module")
def owner() -> Iterator[object]:
    """TransferQueue on a Ray this module starts (and stops), holding two rows."""
    import ray

    from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

    assert not ray.is_initialized(), "another module left Ray running"
    with own_local_ray():  # the owner starts Ray itself, as a trainer's leader without RAY_ADDRESS does
        plane = TransferQueueDataPlane("attach", storage_capacity=16, num_storage_units=1)
        plane.put(["a", "b"], {"ids": [torch.arange(2, dtype=torch.int32), torch.arange(4, dtype=torch.int32)]})
        yield plane
        plane.close()


def run_child(plane: object, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run CHILD on a pickled ``plane`` in a fresh interpreter, with Ray's settings stripped from its environment."""
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    return subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        input=base64.b64encode(pickle.dumps(plane)).decode(),
        env={**base, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_copy_in_a_plain_process_joins_the_owners_cluster_by_address(owner: object) -> None:
    import ray

    copy = pickle.loads(pickle.dumps(owner))
    assert copy.ray_address == ray.get_runtime_context().gcs_address
    assert copy.ray_token_auth  # Ray 2.60's default for a local cluster it starts
    done = run_child(owner)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[[0, 1], [0, 1, 2, 3]]"


def test_a_copy_told_to_join_another_cluster_names_the_owners_address(owner: object) -> None:
    """RAY_ADDRESS wins over the owner's address; landing in another cluster than the owner's is a clear error."""
    import ray

    done = run_child(owner, "192.0.2.250:6379", RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    assert done.returncode != 0
    assert "the data plane lives in the one at 192.0.2.250:6379" in done.stderr
    assert "unset RAY_ADDRESS or set it to 192.0.2.250:6379" in done.stderr


def test_a_read_from_a_frozen_transfer_queue_ends_at_its_deadline_naming_it(owner: object) -> None:
    """TransferQueue's own calls wait without a deadline: with its controller actor frozen (SIGSTOP), a trainer-side
    read ends at ``read_timeout_s`` with a DataPlaneError naming the read and the partition, not never."""
    import signal
    import time

    import ray

    from sc_lightning.data_plane.base import DataPlaneError
    from sc_lightning.data_plane.tq_runtime import CONTROLLER_ACTOR, CONTROLLER_NAMESPACE

    controller = ray.get_actor(CONTROLLER_ACTOR, namespace=CONTROLLER_NAMESPACE)
    pid = ray.get(controller.__ray_call__.remote(lambda _: os.getpid()), timeout=60)
    owner.read_timeout_s = 2.0
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        said = r"a get of 2 rows from TransferQueue partition 'attach' did not finish within 2 s"
        with pytest.raises(DataPlaneError, match=said):
            owner.get(["a", "b"], ["ids"])
        assert time.monotonic() - started < 30
    finally:
        os.kill(pid, signal.SIGCONT)
        owner.read_timeout_s = 1200.0
    assert [row.tolist() for row in owner.get(["a", "b"], ["ids"])["ids"]] == [[0, 1], [0, 1, 2, 3]]  # thawed
