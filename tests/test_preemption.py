"""Preemption: a stop signal ends a fit within seconds from any state, its last finished step's bundle written, and
the same command then trains every prompt exactly once.

The hardest state is a trainer waiting for rollouts that do not come: an environment that stops answering
(tests/helpers/stalling_env.py) holds every rollout of the next step, so before the fix a SIGTERM waited for the
step (up to the stall watchdog's 1,200 s)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import start, stopped_after, user_environment, wait_for
from tests.helpers.configs import TEST_BASE
from tests.helpers.recovery import assert_each_prompt_trained_once, command, write_dataset

pytestmark = pytest.mark.slow
STOP_WITHIN_S = 30.0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=lambda s: s.name)
def test_a_stop_signal_while_waiting_for_rollouts_ends_the_fit_in_seconds_and_resumes_exactly_once(
    tmp_path: Path, signum: signal.Signals
) -> None:
    write_dataset(tmp_path / "prompts.jsonl")
    argv = command(tmp_path, TEST_BASE, "--env.name", "tests.helpers.stalling_env:StallingArithmetic")
    argv += ["--data_plane.backend", "memory", "--checkpointing.save_period", "1000"]
    stall = tmp_path / "stall"
    env = user_environment() | {"SC_TEST_STALL": str(stall)}
    trained = tmp_path / "train_data.jsonl"
    process = start(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: trained.exists() and trained.stat().st_size > 0, process, "a trained step")
        stall.touch()  # the environment stops answering: the next step's rollouts hang in scoring
        assert wait_for(stall.with_suffix(".stalled").exists, process, "a hanging score")
        signalled = time.monotonic()
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
        took = time.monotonic() - signalled
    finally:
        process.kill()
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert took < STOP_WITHIN_S, f"the fit took {took:.1f} s to end after {signum.name}"
    step = stopped_after(stderr, f"{signum.name} received")
    assert (tmp_path / "checkpoints" / f"step_{step}").is_dir() and "Traceback" not in stderr
    stall.unlink()
    again = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {tmp_path / 'checkpoints' / f'step_{step}'}" in again.stderr
    assert_each_prompt_trained_once(tmp_path)
