"""A machine-wide readers-writer lock for the test workers: ``exclusive`` tests run with no other test beside them.

scripts/test.sh runs the suite on two pytest-xdist workers. A learning test checks a wall-clock bar (the shipped
example learns within 10 minutes on the 2-core box), which holds only if the test has both cores: it takes the lock
exclusively, every other test takes it shared. The lock is two ``flock``-ed files in the directory the workers of
one run share; the kernel frees them if a worker dies, and pytest-timeout bounds any wait.

A waiting exclusive test closes a turnstile that every test passes on its way in, so tests of the other worker
cannot keep the lock shared forever: they finish the test they are in, then wait for the exclusive one.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def machine_lock(directory: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold the lock in ``directory`` for the body: exclusively, or shared with other shared holders."""
    with (directory / "turnstile.lock").open("a") as turnstile, (directory / "machine.lock").open("a") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:  # a shared holder lets the next test in; an exclusive one keeps everyone out
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
