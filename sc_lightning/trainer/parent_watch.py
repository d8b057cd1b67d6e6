"""A non-leader trainer rank ends when its parent process does: the launcher, or the leader rank that started it.

Lightning's launcher starts ranks 1 .. N-1 as child processes of rank 0, the leader; torchrun and SLURM start every
rank under an agent. If that parent dies (a SIGKILL of the leader, an agent killed by its scheduler), the other
ranks learn it only at their next collective with it: gloo then fails on the closed connection with a traceback that
blames "a remote worker", NCCL may wait for its timeout, and a rank computing a long step or reading the data plane
goes on until then, holding its device. :func:`watch_parent` checks every :data:`CHECK_EVERY_S` whether the process
has been handed to another parent, and then ends it at once, saying why: the run resumes from its newest bundle.
"""

from __future__ import annotations

import os
import sys
import threading

CHECK_EVERY_S = 1.0
"""How often a rank checks that its parent is alive: the rank ends at most this long after the parent."""
EXIT_PARENT_GONE = 1


def watch_parent(rank: int, *, stop: threading.Event | None = None) -> threading.Thread:
    """Watch this process's parent from a daemon thread; when it is gone, print why and end the process (exit 1).
    ``stop`` ends the watch (for tests)."""
    parent, stop = os.getppid(), stop or threading.Event()

    def watch() -> None:
        """Check the parent until it is gone (or ``stop`` is set)."""
        while not stop.wait(CHECK_EVERY_S):
            if os.getppid() != parent:
                message = (
                    f"trainer rank {rank}: its parent process {parent} (the launcher or the leader rank) has ended, "
                    "so this rank ends too; run the same command to resume from the newest bundle\n"
                )
                os.write(sys.stderr.fileno(), message.encode())
                os._exit(EXIT_PARENT_GONE)

    thread = threading.Thread(target=watch, name=f"sc-parent-watch-{rank}", daemon=True)
    thread.start()
    return thread
