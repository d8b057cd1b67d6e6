"""Three faults in one two-rank run (CPU, gloo, Lightning's launcher, the real CLI), each resumed by the same command:
SIGKILL of the non-leader rank inside a step, SIGKILL of the leader while it writes a bundle, and SIGTERM while the
trainer waits for rollouts (the environment stops answering: tests/helpers/stalling_env.py). The run that finally
finishes has trained every prompt of its 12 steps exactly once, each step the same prompts as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sc_lightning.checkpoint.atomic import TEMPORARY_PREFIX, complete_bundles
from tests.helpers.cli import child_rank_pid, run, start, stopped_after, user_environment, wait_for
from tests.helpers.configs import REPO, TINY_PATH
from tests.helpers.recovery import assert_history_exactly_once, command, write_dataset

pytestmark = pytest.mark.slow

STEPS = 12
TWO_RANKS = (TINY_PATH, REPO / "tests" / "small_steps.yaml")  # the tiny example (engine in a Ray actor), small steps
CALLBACKS = [{"class_path": "tests.helpers.callbacks.TrainedTokens"}]  # marks each chunk as training takes it


def fit_argv(root: Path) -> list[str]:
    """The one command: two ranks, one step ahead, a bundle every step, the stalling verifier."""
    return command(
        root, TWO_RANKS,
        "--trainer.devices", "2",
        "--async_rl.max_buffered_rollouts", "8",
        "--async_rl.max_inflight_prompts", "8",
        "--grpo.max_num_steps", str(STEPS),
        "--checkpointing.save_period", "1",
        "--env.name", "tests.helpers.stalling_env:StallingArithmetic",
        f"--trainer.callbacks={json.dumps(CALLBACKS)}",
    )  # fmt: skip


def prompts_per_step(root: Path) -> dict[int, set[int]]:
    """Which prompts each step of the finished run's history trained."""
    steps: dict[int, set[int]] = defaultdict(set)
    for line in (root / "train_data.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps[row["step"]].add(row["prompt_index"])
    return dict(steps)


def trained_chunk_of_a_step_from(root: Path, step: int) -> bool:
    """Whether a chunk of step ``step`` or later has been handed to training (tests.helpers.callbacks.TrainedTokens)."""
    chunks = root / "trained_tokens.jsonl"
    return chunks.exists() and any(json.loads(line)["step"] >= step for line in chunks.read_text().splitlines())


def newest_bundle(checkpoints: Path) -> int:
    """The step of the newest complete bundle (0: none)."""
    return max((step for step, _ in complete_bundles(checkpoints)), default=0)


def temporaries(checkpoints: Path) -> set[str]:
    """The bundles being written (or left half-written by a kill): their temporary directories' names."""
    return {path.name for path in checkpoints.glob(f"{TEMPORARY_PREFIX}step_*")}


def kill_the_non_leader_inside_a_step(argv: list[str], root: Path, env: dict[str, str]) -> None:
    """SIGKILL rank 1 once a chunk of step 2 or later trains: the run ends within seconds naming rank 1."""
    process = start(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: trained_chunk_of_a_step_from(root, 2), process, "a chunk of step 2"), process.communicate()
    rank1 = child_rank_pid(process.pid, 1)
    assert rank1 is not None
    os.kill(rank1, signal.SIGKILL)
    killed = time.monotonic()
    stderr = process.communicate(timeout=120)[1]
    assert time.monotonic() - killed < 60, f"the run outlived its dead rank by {time.monotonic() - killed:.0f} s"
    assert process.returncode != 0
    named = (  # by the strategy, with where the leader stood; or by Lightning's launcher, whose observer ends the
        # leader within 5 s when no collective noticed first
        f"trainer rank 1 (pid {rank1}) died: killed by SIGKILL; rank 0 noticed it at RL step",
        f"[rank: 1] Child process with PID {rank1} terminated with code -9",
    )
    assert any(message in stderr for message in named), stderr[-3000:]


def kill_the_leader_while_it_writes_a_bundle(argv: list[str], root: Path, env: dict[str, str]) -> None:
    """SIGKILL the leader while a bundle's temporary directory exists, until one kill lands before its rename (a
    write can finish between the observation and the kill: then the next run tries again)."""
    checkpoints = root / "checkpoints"
    for _ in range(5):
        left = temporaries(checkpoints)  # by an earlier kill
        process = start(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        writing = wait_for(lambda: bool(temporaries(checkpoints) - left), process, "a bundle being written")  # noqa: B023
        assert writing, process.communicate()
        os.kill(process.pid, signal.SIGKILL)
        killed = time.monotonic()
        process.communicate(timeout=120)  # returns once rank 1, which shares the pipe, has ended too
        assert time.monotonic() - killed < 60, f"rank 1 outlived the leader by {time.monotonic() - killed:.0f} s"
        if temporaries(checkpoints) - left:
            return  # killed mid-write: the half-written bundle stays under its temporary name, never used
    raise AssertionError("no kill landed while a bundle was written")


def stop_while_waiting_for_rollouts(argv: list[str], root: Path, env: dict[str, str]) -> None:
    """Make the environment stop answering after one more bundle, then SIGTERM the leader: the fit ends within 30 s
    after its last finished step, whose bundle it writes, with exit code 128 + SIGTERM."""
    checkpoints, stall = root / "checkpoints", Path(env["SC_TEST_STALL"])
    resumed_at = newest_bundle(checkpoints)
    process = start(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: newest_bundle(checkpoints) > resumed_at, process, "a bundle"), process.communicate()
    stall.touch()
    assert wait_for(stall.with_suffix(".stalled").exists, process, "a hanging score"), process.communicate()
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    stderr = process.communicate(timeout=120)[1]
    assert time.monotonic() - signalled < 30, f"the fit took {time.monotonic() - signalled:.0f} s after SIGTERM"
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert (checkpoints / f"step_{stopped_after(stderr, 'SIGTERM received')}").is_dir()
    stall.unlink()


@pytest.mark.long(minutes=5)
@pytest.mark.timeout(1200)
def test_three_faults_in_one_two_rank_run_train_each_step_as_an_uninterrupted_run(tmp_path: Path) -> None:
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    runs = {}
    for root in (clean, faulty):
        root.mkdir()
        write_dataset(root / "prompts.jsonl")
        runs[root] = fit_argv(root), user_environment() | {"SC_TEST_STALL": str(root / "stall")}
    # the uninterrupted run trains beside the faulty ones, on a Ray instance of its own (a TransferQueue data plane
    # is one per cluster): its start-up and steps overlap theirs instead of coming first
    argv, env = runs[clean]
    env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
    uninterrupted = start(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    reader = ThreadPoolExecutor(1)
    ended = reader.submit(uninterrupted.communicate, timeout=600)  # reads its stderr meanwhile
    argv, env = runs[faulty]
    try:
        kill_the_non_leader_inside_a_step(argv, faulty, env)
        kill_the_leader_while_it_writes_a_bundle(argv, faulty, env)
        stop_while_waiting_for_rollouts(argv, faulty, env)
    except BaseException:
        uninterrupted.kill()  # a fault's check failed: the test ends with it, not after the uninterrupted run
        raise
    finally:
        reader.shutdown(wait=False)
    stderr = ended.result()[1]
    assert uninterrupted.returncode == 0, stderr[-3000:]

    done = run(*argv[3:], env=env, timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in done.stderr

    assert_history_exactly_once(faulty, STEPS)
    assert prompts_per_step(faulty) == prompts_per_step(clean)
