"""Command-line processes as users start them: from the repository root, in a user's environment, and what they
leave behind (the per-step metrics, the error lines)."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.helpers.configs import REPO, TINY
from tests.helpers.warm_cli import WarmProcess, run_warm

# torch.distributed's rendezvous variables: a test process may have set them up, a child started as a user starts it
# must not inherit them (it would join this process's taken port)
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
# On top of the tiny config: the quickest real run (colocated engine, in-process data plane), quiet
QUICK = ("--config", "configs/colocated.yaml", "--data_plane.backend", "memory", "--trainer.enable_progress_bar=false")


def user_environment(*, without: Sequence[str] = (), without_prefix: str | None = None) -> dict[str, str]:
    """This process's environment as a user's shell would hold it: no rendezvous, nor the names in ``without``."""
    dropped = {*RENDEZVOUS, *without}
    return {
        k: v
        for k, v in os.environ.items()
        if k not in dropped and (without_prefix is None or not k.startswith(without_prefix))
    }


def run(
    *args: str, timeout_s: float = 300, env: dict[str, str] | None = None, fresh: bool = False
) -> subprocess.CompletedProcess:
    """``python -m sc_lightning *args`` to its end from the repository root, in ``env`` (a user's environment by
    default); its exit code, stdout and stderr.

    The process is a fork of a preloaded interpreter (:mod:`tests.helpers.warm_cli`: seconds of imports saved), or
    with ``fresh`` a new interpreter, for what only a fresh start shows (its imports, their output and time).
    """
    env = user_environment() if env is None else env
    if not fresh:
        return run_warm(args, cwd=str(REPO), env=env, timeout_s=timeout_s)
    command = [sys.executable, "-m", "sc_lightning", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=env)


def start(
    argv: Sequence[str], *, env: dict[str, str] | None = None, fresh: bool = False, **popen: Any
) -> subprocess.Popen | WarmProcess:
    """Start ``argv`` from the repository root in ``env`` (a user's environment by default); ``popen`` goes to
    :class:`subprocess.Popen` (the pipes, ``text``, ``start_new_session``).

    ``python -m sc_lightning ...`` starts as a fork of the preloaded interpreter (:class:`WarmProcess`, as
    :func:`run`) unless ``fresh``; any other command as a new process.
    """
    env = user_environment() if env is None else env
    if not fresh and list(argv[:3]) == [sys.executable, "-m", "sc_lightning"]:
        return WarmProcess(argv[3:], cwd=str(REPO), env=env, **popen)
    return subprocess.Popen(list(argv), cwd=REPO, env=env, **popen)


def wait_for(
    predicate: Callable[[], bool], process: subprocess.Popen | WarmProcess, what: str, timeout_s: float = 180
) -> bool:
    """Poll an outside observation of the run until it holds (True) or the run ended first (False)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
    return True


def proc_stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command's name: state, ppid, pgrp, session, ... (``proc(5)``);
    OSError once the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def child_pid(parent: int, assignment: str) -> int | None:
    """The pid of a child process of ``parent`` whose environment holds ``assignment`` (e.g. ``LOCAL_RANK=1``, a
    trainer rank that Lightning's launcher started); None while there is none."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(proc_stat(entry.name)[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent and assignment.encode() in env:
            return int(entry.name)
    return None


def signal_another_thread(pid: int, signum: int) -> int:
    """Send ``signum`` to a thread of process ``pid`` other than its main one (the oldest that does not block it), as
    the kernel may deliver a signal sent to the process; Python runs the handler in the main thread only once that
    thread runs Python code again. Returns the thread's id."""
    tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    for tid in sorted(int(entry.name) for entry in Path(f"/proc/{pid}/task").iterdir()):
        try:
            status = (Path(f"/proc/{pid}/task") / str(tid) / "status").read_text()
        except OSError:
            continue  # ended meanwhile
        (mask,) = re.findall(r"^SigBlk:\s*([0-9a-f]+)$", status, re.MULTILINE)
        blocked = int(mask, 16)
        if tid != pid and not blocked >> (signum - 1) & 1 and tgkill(pid, tid, signum) == 0:
            return tid
    raise AssertionError(f"process {pid} has no thread but its main one that takes signal {signum}")


def step_metrics(root: Path) -> list[dict[str, str]]:
    """The per-step rows of the one run's CSV metrics under ``root``, as dicts."""
    (metrics,) = root.glob("lightning_logs/version_*/metrics.csv")
    header, *rows = metrics.read_text().splitlines()
    return [dict(zip(header.split(","), row.split(","), strict=True)) for row in rows]


def error_lines(stderr: str) -> list[str]:
    """The ``error:`` lines of a command's stderr."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def checkpointed(tmp_path: Path, *extra: str) -> list[str]:
    """``fit`` of the tiny example with a bundle every 1000 steps (so only the end of a fit writes one)."""
    return [
        "fit", "--config", TINY, *QUICK,
        "--checkpointing.enabled", "true",
        "--checkpointing.save_data_plane", "true",
        "--checkpointing.checkpoint_dir", str(tmp_path / "ckpt"),
        "--checkpointing.save_period", "1000",
        "--trainer.default_root_dir", str(tmp_path),
        *extra,
    ]  # fmt: skip


def stopped_after(stderr: str, reason: str) -> int:
    """The step of the stop line naming ``reason`` (one line, Lightning's own stop line dropped)."""
    assert "max_epochs" not in stderr, stderr[-3000:]
    lines = re.findall(rf"^fit stopped after step (\d+): {re.escape(reason)}.*$", stderr, re.MULTILINE)
    assert len(lines) == 1, stderr[-3000:]
    return int(lines[0])


def child_rank_pid(parent: int, local_rank: int) -> int | None:
    """The pid of the trainer rank ``local_rank`` that Lightning's launcher in ``parent`` started (None: not yet)."""
    return child_pid(parent, f"LOCAL_RANK={local_rank}")
