"""The test workers' machine lock (tests/exclusive.py), in real processes: shared holders run together, an
exclusive one alone, and a waiting exclusive holder is not overtaken by shared ones that come after it."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from tests.exclusive import machine_lock

CONTEXT = multiprocessing.get_context("spawn")
DEADLINE_S = 60


def _hold(directory: Path, exclusive: bool, name: str, entered=None, release=None, meet=None) -> None:  # noqa: ANN001
    """Take the lock, log ``name`` in, signal ``entered``, meet the others at ``meet`` or wait for ``release``."""
    with machine_lock(directory, exclusive=exclusive):
        _log(directory, f"{name} in")
        if entered is not None:
            entered.set()
        if meet is not None:
            meet.wait(DEADLINE_S)  # raises (exit code 1) unless all the holders get in together
        if release is not None:
            assert release.wait(DEADLINE_S)
        _log(directory, f"{name} out")


def _log(directory: Path, event: str) -> None:
    """Append ``event`` to the run's log (one write each: the file keeps the order they happened in)."""
    with (directory / "log.txt").open("a") as handle:
        handle.write(event + "\n")


def _start(*args: object) -> multiprocessing.Process:
    process = CONTEXT.Process(target=_hold, args=args)
    process.start()
    return process


def _blocked_on_a_lock(pid: int) -> bool:
    """Whether ``pid`` waits for a flock (a ``->`` line of /proc/locks names the waiters)."""
    return any(line.split()[1] == "->" and f" {pid} " in line for line in Path("/proc/locks").read_text().splitlines())


def _wait_until(predicate, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def _join(*processes: multiprocessing.Process) -> None:
    for process in processes:
        process.join(DEADLINE_S)
        assert process.exitcode == 0, process.exitcode


def test_shared_holders_hold_the_lock_together(tmp_path: Path) -> None:
    """Three shared holders meet inside the lock (the barrier breaks if one cannot get in while the others hold)."""
    meet = CONTEXT.Barrier(3)
    _join(*[_start(tmp_path, False, f"s{i}", None, None, meet) for i in range(3)])
    events = (tmp_path / "log.txt").read_text().splitlines()
    assert all(event.endswith(" in") for event in events[:3]) and len(events) == 6, events  # all in, then out


def test_a_waiting_exclusive_holder_goes_before_shared_ones_that_come_after_it(tmp_path: Path) -> None:
    """A holds shared; B asks exclusively and waits; C asks shared and waits too (turnstile); A leaves: B, then C."""
    a_in, a_release, b_in, b_release = CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Event()
    a = _start(tmp_path, False, "A", a_in, a_release)
    assert a_in.wait(DEADLINE_S)
    b = _start(tmp_path, True, "B", b_in, b_release)
    _wait_until(lambda: _blocked_on_a_lock(b.pid), "B waits for the lock")
    c = _start(tmp_path, False, "C")
    _wait_until(lambda: _blocked_on_a_lock(c.pid), "C waits for the lock")
    a_release.set()
    assert b_in.wait(DEADLINE_S)
    b_release.set()
    _join(a, b, c)
    assert (tmp_path / "log.txt").read_text().splitlines() == ["A in", "A out", "B in", "B out", "C in", "C out"]
