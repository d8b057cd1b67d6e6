"""Preemption: a stop signal ends a fit within seconds from any state, its last finished step's bundle written, and
the same command then trains every prompt exactly once.

The hardest state is a trainer waiting for rollouts that do not come: an environment that stops answering
(tests/helpers/stalling_env.py) holds every rollout of the next step, so before the fix a SIGTERM waited for the
step (up to the stall watchdog's 1,200 s)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import run, signal_another_thread, start, stopped_after, user_environment, wait_for
from tests.helpers.configs import REPO, TEST_BASE, TINY_PATH
from tests.helpers.recovery import assert_each_prompt_trained_once, command, write_dataset

pytestmark = pytest.mark.slow
STOP_WITHIN_S = 30.0


@pytest.mark.parametrize(
    ("signum", "to_a_thread"),
    [(signal.SIGTERM, False), (signal.SIGUSR1, False), (signal.SIGTERM, True)],
    ids=["SIGTERM", "SIGUSR1", "SIGTERM-on-another-thread"],
)
def test_a_stop_signal_while_waiting_for_rollouts_ends_the_fit_in_seconds_and_resumes_exactly_once(
    tmp_path: Path, signum: signal.Signals, to_a_thread: bool
) -> None:
    """``to_a_thread``: the signal lands on a thread other than the main one, as the kernel may deliver one sent to
    the process (a full run once had a SIGTERM wait past the stall for the trainer's wait to end on its own)."""
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
        if to_a_thread:
            signal_another_thread(process.pid, signum)
        else:
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
    again = run(*argv[3:], env=env, timeout_s=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {tmp_path / 'checkpoints' / f'step_{step}'}" in again.stderr
    assert_each_prompt_trained_once(tmp_path)


def test_a_stop_signal_inside_a_streamed_step_ends_the_fit_without_its_bundle_and_resumes_exactly_once(
    tmp_path: Path,
) -> None:
    """The trainer streams a step's groups (one ready group starts it); the step's last prompt hangs in scoring, so a
    SIGTERM lands inside the step, after a chunk was trained: the fit ends within seconds without that step's bundle
    (half a step is no state to resume), the newest bundle stands, and the same command resumes exactly once."""
    write_dataset(tmp_path / "prompts.jsonl")
    callbacks = [{"class_path": "tests.helpers.callbacks.TrainedTokens"}]
    one_ahead = (TINY_PATH, REPO / "tests" / "small_steps.yaml")  # generation in its own actor: a step can stream
    argv = command(tmp_path, one_ahead, "--env.name", "tests.helpers.stalling_env:StallingArithmetic")
    argv += [
        "--data_plane.backend", "memory",
        "--data.shuffle", "false",  # step k trains prompts 4k .. 4k + 3
        "--async_rl.min_groups_for_streaming_train", "1",
        "--async_rl.max_buffered_rollouts", "8",
        "--async_rl.max_inflight_prompts", "8",
        "--checkpointing.save_period", "1",
        f"--trainer.callbacks={json.dumps(callbacks)}",
    ]  # fmt: skip
    stall, chunks = tmp_path / "stall", tmp_path / "trained_tokens.jsonl"
    stall.touch()
    env = user_environment() | {"SC_TEST_STALL": str(stall), "SC_TEST_STALL_FROM": "7"}  # step 1's last prompt

    def step_1_began() -> bool:
        return chunks.exists() and any(json.loads(line)["step"] == 1 for line in chunks.read_text().splitlines())

    process = start(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(stall.with_suffix(".stalled").exists, process, "a hanging score")
        assert wait_for(step_1_began, process, "a chunk of step 1 trained")
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
        took = time.monotonic() - signalled
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert took < STOP_WITHIN_S, f"the fit took {took:.1f} s to end after SIGTERM"
    assert "fit stopped during step 1: SIGTERM received" in stderr and "that step has no bundle" in stderr
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / "step_1").is_dir() and not (checkpoints / "step_2").exists()
    assert "Traceback" not in stderr
    stall.unlink()
    again = run(*argv[3:], env=env, timeout_s=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {checkpoints / 'step_1'}" in again.stderr
    assert_each_prompt_trained_once(tmp_path)
