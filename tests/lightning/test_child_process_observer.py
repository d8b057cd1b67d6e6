"""A coordinated stop quiets Lightning's child-process observer, which would otherwise SIGKILL the leader when the
ranks it started exit with the stop signal's code."""

from __future__ import annotations

import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

from sc_lightning.callbacks.stop import CHILD_PROCESS_OBSERVER, FitStop, quiet_child_process_observer
from tests.helpers.fits import tiny_config


def waiting_process(exit_code: int) -> subprocess.Popen[bytes]:
    """A Python process that waits for its stdin to close, then exits with ``exit_code``."""
    code = f"import sys; sys.stdin.read(); sys.exit({exit_code})"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


@pytest.mark.parametrize("quiet", [False, True])
def test_a_quieted_observer_leaves_the_leader_alive_when_a_rank_exits_143(quiet: bool) -> None:
    leader, rank = waiting_process(0), waiting_process(143)  # the leader stands in for the launching process
    observer = _ChildProcessObserver(main_pid=leader.pid, child_processes=[rank], sleep_period=0.01)
    assert observer.name == CHILD_PROCESS_OBSERVER  # the name the quieting looks for
    observer.start()
    try:
        if quiet:
            quiet_child_process_observer()
        rank.stdin.close()
        assert rank.wait(timeout=60) == 143
        observer.join(timeout=60)
        assert not observer.is_alive()
        if quiet:
            assert leader.poll() is None  # not killed: it goes on to its bundle and its own exit code
        else:
            assert leader.wait(timeout=60) == -9  # what Lightning does unquieted: the leader is SIGKILLed
    finally:
        if leader.poll() is None:
            leader.stdin.close()
            leader.wait(timeout=60)


def test_fit_stop_quiets_the_observer_once_the_ranks_agree_to_stop() -> None:
    """The wiring: the step's collective that finds a stop signal on some rank replaces the observer's check (what
    the test above shows keeps the leader alive), and a step without one leaves it watching."""
    leader, rank = waiting_process(0), waiting_process(0)
    observer = _ChildProcessObserver(main_pid=leader.pid, child_processes=[rank], sleep_period=0.01)
    observer.start()
    try:
        fit_stop = FitStop(tiny_config())
        received = {"value": 0}
        reduce = lambda *_, **__: torch.tensor(received["value"])  # noqa: E731  # what every rank reported, max
        trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu"), reduce=reduce))
        trainer.should_stop = False
        fit_stop.on_train_batch_end(trainer, None, None, None, 0)  # no signal anywhere: still watching
        assert not trainer.should_stop and "_run" not in vars(observer)
        received["value"] = int(signal.SIGTERM)  # another rank got SIGTERM
        fit_stop.on_train_batch_end(trainer, None, None, None, 1)
        assert trainer.should_stop and fit_stop.exit_code == 143
        assert "_run" in vars(observer) and observer._run() is True  # its next look ends it, killing nothing
    finally:
        for process in (rank, leader):
            process.stdin.close()
            process.wait(timeout=60)
        observer.join(timeout=60)
