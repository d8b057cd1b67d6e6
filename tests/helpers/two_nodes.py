"""Two trainer nodes on one box: ``scripts/two_nodes_local.sh`` (a two-node Ray cluster on 127.0.0.1 and the two
node processes) started and run to its end, or its stacks taken when it hangs; and a two-node Ray cluster that
several runs of the script join (``RAY_CLUSTER``) instead of each starting its own."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.cli import proc_stat, user_environment
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


@dataclass
class TwoNodes:
    """A started run of the script: its process (a session of its own) and the file its stderr goes to."""

    process: subprocess.Popen
    stderr_path: Path

    def stderr(self) -> str:
        """What the script and its node processes printed to stderr so far."""
        return self.stderr_path.read_text(errors="replace")


def start_two_nodes(
    tmp_path: Path,
    *fit_args: str,
    launcher: str,
    head_cpus: int,
    node1_cpus: int,
    ranks_per_node: int = 1,
    cluster: dict[str, str] | None = None,
) -> TwoNodes:
    """Start the script with ``fit_args``, each node's ``ranks_per_node`` ranks started by ``launcher`` (``lightning``
    or ``torchrun``), on a cluster of its own (Ray nodes of ``head_cpus`` and ``node1_cpus`` CPUs, its own auth token,
    the Ray nodes' output under ``tmp_path / "nodes"``) or, with ``cluster``, on :func:`two_node_cluster`'s, in a
    session of its own; its stderr goes to a new file in ``tmp_path``, read whole even when the run is stopped."""
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
    stderr_path = tmp_path / f"two_nodes.{len(list(tmp_path.glob('two_nodes.*.stderr')))}.stderr"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [str(SCRIPT), *fit_args],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # every process it starts is in its session
        )
    return TwoNodes(process, stderr_path)


def finish(run: TwoNodes, timeout_s: float) -> str:
    """Wait for the script to end; its stderr. Past ``timeout_s`` the Python stacks of every process of its session
    are taken (where it hangs), it is stopped as Ctrl-C stops it (it ends its node processes and Ray nodes) and the call
    fails with its output and the stacks; either way its whole session is killed after."""
    process = run.process
    try:
        process.wait(timeout=timeout_s)
        return run.stderr()
    except subprocess.TimeoutExpired:
        stacks = session_stacks(process.pid)
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_GRACE_S)
        stopped = "" if process.poll() is not None else "\n(the script did not stop within its grace either)"
        message = f"the two-node run outlived {timeout_s:.0f} s{stopped}:\n{run.stderr()[-6000:]}\n{stacks}"
        raise AssertionError(message) from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of its session is left (nothing, normally)
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def session_stacks(session: int) -> str:
    """The Python stacks of every process in ``session`` (``py-spy dump``, which Ray installs), each headed by its
    command line: where a run that outlived its deadline waits."""
    py_spy = Path(sys.executable).parent / "py-spy"
    dumps = []
    for entry in Path("/proc").iterdir():
        try:
            in_session = entry.name.isdigit() and int(proc_stat(entry.name)[3]) == session
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if not in_session or "python" not in command:
            continue
        try:
            dump = subprocess.run(
                [str(py_spy), "dump", "--pid", entry.name], capture_output=True, text=True, timeout=30
            )
            dumps.append(f"--- {entry.name}: {command}\n{dump.stdout}{dump.stderr}")
        except (OSError, subprocess.TimeoutExpired) as error:
            dumps.append(f"--- {entry.name}: {command}\n(no stack: {error})")
    return "\n".join(dumps) or "(no Python process left in the run's session)"


def two_node_run(tmp_path: Path, *fit_args: str, timeout_s: float, **cluster: object) -> str:
    """Run the script (:func:`start_two_nodes` with ``cluster``'s keywords) to its end within ``timeout_s``; its
    stderr once it succeeded."""
    run = start_two_nodes(tmp_path, *fit_args, **cluster)  # type: ignore[arg-type]
    stderr = finish(run, timeout_s)
    assert run.process.returncode == 0, stderr[-5000:]
    return stderr
