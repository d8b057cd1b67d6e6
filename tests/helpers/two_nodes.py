"""Two trainer nodes on one box: ``scripts/two_nodes_local.sh`` (a two-node Ray cluster on 127.0.0.1 and the node
processes NODE_RANK 0 and 1) run to its end, and the run's arguments."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers.cli import user_environment
from tests.helpers.configs import REPO

SCRIPT = REPO / "scripts" / "two_nodes_local.sh"
STOP_GRACE_S = 60.0


def two_node_run(
    tmp_path: Path,
    *fit_args: str,
    launcher: str,
    head_cpus: int,
    node1_cpus: int,
    timeout_s: float,
    ranks_per_node: int = 1,
) -> str:
    """Run the script with ``fit_args``, each node's ``ranks_per_node`` ranks started by ``launcher`` (``lightning`` or
    ``torchrun``), on a cluster of its own (Ray nodes of ``head_cpus`` and ``node1_cpus`` CPUs, its own auth token,
    the Ray nodes' output under ``tmp_path / "nodes"``); return its stderr once it succeeded.

    Past ``timeout_s`` the script is stopped as Ctrl-C stops it (it ends its node processes and Ray nodes), then its
    whole session is killed; either way the call fails with the script's output.
    """
    env = user_environment(without=("RAY_ADDRESS", "RAY_AUTH_TOKEN")) | {
        "LAUNCHER": launcher,
        "PYTHON": sys.executable,
        "RANKS_PER_NODE": str(ranks_per_node),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_HEAD_CPUS": str(head_cpus),
        "RAY_NODE1_CPUS": str(node1_cpus),
        "TWO_NODES_DIR": str(tmp_path / "nodes"),
    }
    process = subprocess.Popen(
        [str(SCRIPT), *fit_args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # every process it starts is in its session
    )
    try:
        _, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            stderr = "(the script did not stop within its grace either)"
        raise AssertionError(f"the two-node run outlived {timeout_s:.0f} s:\n{stderr[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of its session is left (nothing, normally)
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0, stderr[-5000:]
    return stderr
