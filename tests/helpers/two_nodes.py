"""Two trainer nodes on one box: ``scripts/two_nodes_local.sh`` (a two-node Ray cluster on 127.0.0.1 and the two
node processes) started, run to its end, and its node processes found; and a two-node Ray cluster that several runs
of the script join (``RAY_CLUSTER``) instead of each starting its own."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.cli import child_pid, user_environment
from tests.helpers.configs import REPO
from tests.helpers.ray_head import RayHead

SCRIPT = REPO / "scripts" / "two_nodes_local.sh"
STOP_GRACE_S = 60.0


@contextlib.contextmanager
def two_node_cluster(*, head_cpus: int, node1_cpus: int) -> Iterator[dict[str, str]]:
    """A two-node Ray cluster on 127.0.0.1 as the script starts one (a head of ``head_cpus`` logical CPUs and a second
    node of ``node1_cpus``, token authentication), for runs of the script to join: yields the environment that names
    it to :func:`start_two_nodes` (``RAY_CLUSTER`` and its token). Starting two Ray nodes is about a third of a short
    run's time, and their processes are the cluster's own, not a run's: each run starts and ends its own node
    processes, engines and data plane on it, as on a cluster that outlives its jobs."""
    temp_dir = Path(tempfile.mkdtemp(prefix="sc-ray-"))  # short: Ray's socket paths are bounded
    head = RayHead(temp_dir, num_cpus=head_cpus)
    nodes = [head]
    try:
        head.wait_ready()
        nodes.append(RayHead(temp_dir, num_cpus=node1_cpus, join=head))
        nodes[-1].wait_ready()
        yield {"RAY_CLUSTER": head.address, **head.auth_env}
    finally:
        for node in reversed(nodes):  # the second node first: a node whose head is gone waits for it
            node.stop()


def start_two_nodes(
    tmp_path: Path,
    *fit_args: str,
    launcher: str,
    head_cpus: int,
    node1_cpus: int,
    ranks_per_node: int = 1,
    cluster: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start the script with ``fit_args``, each node's ``ranks_per_node`` ranks started by ``launcher`` (``lightning``
    or ``torchrun``), on a cluster of its own (Ray nodes of ``head_cpus`` and ``node1_cpus`` CPUs, its own auth token,
    the Ray nodes' output under ``tmp_path / "nodes"``) or, with ``cluster``, on :func:`two_node_cluster`'s, in a
    session of its own; its stderr is piped (text)."""
    env = user_environment(without=("RAY_ADDRESS", "RAY_AUTH_TOKEN")) | {
        "LAUNCHER": launcher,
        "PYTHON": sys.executable,
        "RANKS_PER_NODE": str(ranks_per_node),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_HEAD_CPUS": str(head_cpus),
        "RAY_NODE1_CPUS": str(node1_cpus),
        "TWO_NODES_DIR": str(tmp_path / "nodes"),
        **(cluster or {}),
    }
    return subprocess.Popen(
        [str(SCRIPT), *fit_args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # every process it starts is in its session
    )


def finish(process: subprocess.Popen, timeout_s: float) -> str:
    """Wait for the script to end; its stderr. Past ``timeout_s`` it is stopped as Ctrl-C stops it (it ends its node
    processes and Ray nodes) and the call fails with its output; either way its whole session is killed after."""
    try:
        return process.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            stderr = process.communicate(timeout=STOP_GRACE_S)[1]
        except subprocess.TimeoutExpired:
            stderr = "(the script did not stop within its grace either)"
        raise AssertionError(f"the two-node run outlived {timeout_s:.0f} s:\n{stderr[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of its session is left (nothing, normally)
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def two_node_run(tmp_path: Path, *fit_args: str, timeout_s: float, **cluster: object) -> str:
    """Run the script (:func:`start_two_nodes` with ``cluster``'s keywords) to its end within ``timeout_s``; its
    stderr once it succeeded."""
    process = start_two_nodes(tmp_path, *fit_args, **cluster)  # type: ignore[arg-type]
    stderr = finish(process, timeout_s)
    assert process.returncode == 0, stderr[-5000:]
    return stderr


def node_pid(script: subprocess.Popen, node: int) -> int | None:
    """The pid of the script's node process ``node`` (Lightning's launcher: its child with ``NODE_RANK=node``), or
    None while there is none."""
    return child_pid(script.pid, f"NODE_RANK={node}")
