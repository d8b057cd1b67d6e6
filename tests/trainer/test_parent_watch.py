"""A non-leader rank ends within seconds of its parent (the leader or the launcher), saying why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from sc_lightning.trainer.parent_watch import CHECK_EVERY_S, EXIT_PARENT_GONE
from tests.helpers.cli import proc_stat

RANK = textwrap.dedent(
    """
    import threading
    from sc_lightning.trainer.parent_watch import watch_parent
    watch_parent(1)
    print("watching", flush=True)
    threading.Event().wait(120)  # a rank blocked in a collective
    """
)
PARENT = textwrap.dedent(
    """
    import subprocess, sys, threading
    rank = subprocess.Popen(
        [sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, stderr=open(sys.argv[2], "w"), text=True
    )
    assert rank.stdout.readline() == "watching\\n"  # the watch runs: now the leader may die
    print(rank.pid, flush=True)
    threading.Event().wait(120)  # the leader, until it is killed
    """
)


def test_a_rank_whose_parent_is_killed_ends_within_seconds_naming_it(tmp_path: Path) -> None:
    log = tmp_path / "rank.log"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, RANK, str(log)], stdout=subprocess.PIPE, text=True)
    rank = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    killed, deadline = time.monotonic(), time.monotonic() + 10 * CHECK_EVERY_S
    while _alive(rank):
        assert time.monotonic() < deadline, "the rank outlived its parent"
        time.sleep(0.05)
    assert time.monotonic() - killed < 10 * CHECK_EVERY_S
    assert f"trainer rank 1: its parent process {parent.pid} (the launcher or the leader rank) has ended" in (
        log.read_text()
    )
    assert EXIT_PARENT_GONE == 1


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie of an exited orphan counts as ended)."""
    try:
        state = proc_stat(pid)[0]
    except OSError:
        return False
    return state != "Z"
