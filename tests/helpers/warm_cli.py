"""``python -m sc_lightning`` as a fork of a preloaded interpreter: the same command without seconds of imports.

A command-line process spends most of a short run importing torch, Lightning, megatron-core and transformers
(about 10 of the 12 CPU seconds of a 3-step colocated ``fit`` on the 2-core box), and the suite starts a few hundred
of them. Here a ``multiprocessing`` forkserver, one per test process, imports those once, in the order and the way
the CLI does (:func:`sc_lightning.cli.lean_imports.import_lightning` first), and each command is a fork of it. The
fork is the command as a user's shell starts it in every way a test observes: its own pid (signals, SIGKILL), working
directory, environment, stdin/stdout/stderr, optionally its own session; it runs ``sc_lightning``'s ``__main__`` as
``python -m`` does (``runpy``, ``sys.argv``) as a main process (``multiprocessing.parent_process()`` is None), and
ends as an interpreter ends: non-daemon threads joined, ``atexit`` handlers run, streams flushed, the exit code of its
``SystemExit``.

What a fork cannot show is a fresh interpreter's start: its imports, their time and their output. The tests of those
start real processes (``fresh=True`` in :mod:`tests.helpers.cli`, and the lean-import, console, walkthrough and
learning tests).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.process
import multiprocessing.reduction
import os
import runpy
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import IO, Any

PRELOAD = "tests.helpers.cli_imports"
"""The module the forkserver imports first: the CLI's heavy imports, in the CLI's way."""

_context: Any = None


def _forkserver() -> Any:
    """This process's forkserver context (its server starts at the first command and lives as long as this process)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload([PRELOAD])
    return _context


class _Fd:
    """A file descriptor that travels to the forked command (through the forkserver's socket) when pickled."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _received_fd, (multiprocessing.reduction.DupFd(self.fd),)


def server_pids() -> set[int]:
    """The processes this test process keeps for forking commands (the forkserver and multiprocessing's resource
    tracker), which a check for leftover child processes leaves out."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    pids = {
        multiprocessing.forkserver._forkserver._forkserver_pid,  # type: ignore[attr-defined]
        multiprocessing.resource_tracker._resource_tracker._pid,  # type: ignore[attr-defined]
    }
    return {pid for pid in pids if pid is not None}


def _received_fd(duplicate: Any) -> int:
    """The descriptor a :class:`_Fd` became in the forked command."""
    return duplicate.detach()


def _run_cli(args: list[str], cwd: str, env: dict[str, str], fds: dict[int, int], new_session: bool) -> None:
    """The forked command: take its place (stdio, session, cwd, environment), run ``python -m sc_lightning``, end."""
    for target, fd in fds.items():
        os.dup2(fd, target)
        os.close(fd)
    if new_session:
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _become_main_process()
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's stdin, as an interpreter opens it
    sys.argv = ["-m", *args]
    code = 0
    try:
        runpy.run_module("sc_lightning", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = _exit_code(done.code)
    except BaseException:  # noqa: BLE001 - an uncaught error ends a python process with its traceback and code 1
        traceback.print_exc()
        code = 1
    finally:
        threading._shutdown()  # type: ignore[attr-defined]  # an interpreter's exit: join non-daemon threads,
        atexit._run_exitfuncs()  # then its atexit handlers, then its streams
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _become_main_process() -> None:
    """Make ``multiprocessing`` see this fork as a main process, as it sees a command a shell started."""
    me = multiprocessing.current_process()
    me._name, me._identity, me._parent_pid = "MainProcess", (), None  # type: ignore[attr-defined]
    multiprocessing.process._parent_process = None  # type: ignore[attr-defined]
    multiprocessing.process._children.clear()  # type: ignore[attr-defined]


def _exit_code(code: object) -> int:
    """The exit status ``SystemExit(code)`` gives an interpreter."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


class WarmProcess:
    """``subprocess.Popen`` of ``python -m sc_lightning ARGS`` as a fork of the preloaded interpreter.

    Takes Popen's ``cwd``, ``env``, ``stdin``/``stdout``/``stderr`` (``None``, ``PIPE`` or ``DEVNULL``), ``text`` and
    ``start_new_session``; offers ``pid``, ``returncode``, ``poll``, ``wait``, ``communicate``, ``send_signal``,
    ``terminate``, ``kill`` and the pipes, as Popen does.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        cwd: str,
        env: dict[str, str],
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        text: bool = False,
        start_new_session: bool = False,
    ) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        child_ends: dict[int, int] = {}
        for target, how in ((0, stdin), (1, stdout), (2, stderr)):
            if how == subprocess.PIPE:
                read, write = os.pipe()
                ours, theirs = (write, read) if target == 0 else (read, write)
                mode = ("w" if target == 0 else "r") + ("" if text else "b")
                setattr(self, ("stdin", "stdout", "stderr")[target], open(ours, mode))  # noqa: SIM115
                child_ends[target] = theirs
            elif how == subprocess.DEVNULL:
                child_ends[target] = os.open(os.devnull, os.O_RDWR)
            elif how is not None:
                raise ValueError(f"WarmProcess takes None, PIPE or DEVNULL for a stream, not {how!r}")
        fds = {target: _Fd(fd) for target, fd in child_ends.items()}
        self._process = _forkserver().Process(
            target=_run_cli, args=(self.args, cwd, env, fds, start_new_session), daemon=False
        )
        try:
            self._process.start()
        finally:
            for fd in child_ends.values():
                os.close(fd)
        self.pid: int = self._process.pid

    def poll(self) -> int | None:
        """The exit code once the command ended (negative: the signal that ended it), else None."""
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command's end (``subprocess.TimeoutExpired`` after ``timeout`` seconds); its exit code."""
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode  # type: ignore[return-value]

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:  # noqa: A002
        """Write ``input`` to stdin, read stdout and stderr to their ends, wait: ``(stdout, stderr)``, None where no
        pipe."""
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        read: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda name=name, pipe=pipe: read.__setitem__(name, pipe.read()), daemon=True)
            for name, pipe in (("stdout", self.stdout), ("stderr", self.stderr))
            if pipe is not None
        ]
        for reader in readers:
            reader.start()
        self.wait(timeout)
        for reader in readers:
            reader.join(timeout)
            if reader.is_alive():  # a descendant of the command still holds the pipe open
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return read.get("stdout"), read.get("stderr")

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the command (nothing once it has ended)."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        """SIGTERM the command."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the command."""
        self.send_signal(signal.SIGKILL)


def run_warm(args: Sequence[str], *, cwd: str, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """``python -m sc_lightning *args`` forked from the preloaded interpreter, to its end; like ``subprocess.run``
    with ``capture_output=True, text=True`` (killed and ``TimeoutExpired`` after ``timeout_s``)."""
    process = WarmProcess(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return subprocess.CompletedProcess(["python", "-m", "sc_lightning", *args], process.returncode, stdout, stderr)
