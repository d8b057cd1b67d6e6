"""One run at a time per checkpoint directory: an OS lock on ``checkpoint_dir/.lock``, held while the run lives.

Two runs writing bundles into one directory would mix their bundles (and sweep each other's temporaries). The
launching process takes ``flock`` on the lock file before it looks for a bundle to resume from, and keeps it until
it ends; the OS releases it when the process ends in any way, SIGKILL included, so a killed run's directory is free
for the same command at once. The file names the holder (pid, host, start time) for the error the next run prints.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path
from types import TracebackType

LOCK_FILE = ".lock"


class CheckpointDirInUse(RuntimeError):
    """Another live run holds the checkpoint directory (or it cannot be made); the message says which and what to do."""


class CheckpointDirLock:
    """The lock on a checkpoint directory, held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self.path = checkpoint_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> CheckpointDirLock:
        """Take the lock without waiting; CheckpointDirInUse naming the holder when another run has it."""
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise CheckpointDirInUse(
                f"checkpointing.checkpoint_dir={str(directory)!r} cannot be used: {err.strerror or err}; "
                "choose a directory this user can write"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise CheckpointDirInUse(
                f"checkpointing.checkpoint_dir={str(directory)!r} is in use by another run ({holder}); wait for it "
                "to end, or give this run another checkpointing.checkpoint_dir"
            ) from None
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock back (the file stays: removing it would race with a run taking it)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> CheckpointDirLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()
