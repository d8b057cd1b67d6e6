"""How a ``fit`` command ends, as users see it: the bundle of its last step, the stop line naming the real reason,
the exit code, and the same command going on from there.

The real command in a subprocess (colocated, in-process data plane: the quickest real run). In-process fits ending
by a callback's ``should_stop`` or a stop signal are in tests/checkpoint/test_fit_end_bundle.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sc_lightning.cli.load import load_and_check
from sc_lightning.config import ConfigError
from tests.helpers.cli import checkpointed, run, start, stopped_after, wait_for
from tests.helpers.configs import REPO, TINY


@pytest.mark.slow
def test_a_max_time_fit_leaves_its_last_step_bundle_and_the_same_command_goes_on(tmp_path: Path) -> None:
    """The issue's example: a time-limited job progresses at every run (max_time counts each command's time)."""
    argv = checkpointed(tmp_path, "--grpo.max_num_steps", "400", "--trainer.max_time", "00:00:00:04")
    first = run(*argv)
    assert first.returncode == 0, first.stderr[-3000:]
    step = stopped_after(first.stderr, "trainer.max_time (00:00:00:04) reached")
    bundle = tmp_path / "ckpt" / f"step_{step}"
    assert step > 0 and bundle.is_dir()
    assert f"its bundle is {bundle}: run the same command to go on" in first.stderr
    second = run(*argv)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from {bundle}" in second.stderr
    later = stopped_after(second.stderr, "trainer.max_time (00:00:00:04) reached")
    assert later > step and (tmp_path / "ckpt" / f"step_{later}").is_dir()


@pytest.mark.slow
def test_sigterm_ends_the_fit_after_its_step_with_that_bundle_and_exit_code_143(tmp_path: Path) -> None:
    argv = checkpointed(tmp_path, "--grpo.max_num_steps", "400", "--data.train_data_log", "true")
    trained = tmp_path / "train_data.jsonl"
    process = start(
        [sys.executable, "-m", "sc_lightning", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = wait_for(lambda: trained.exists() and trained.stat().st_size > 0, process, "a trained step")
        assert started, process.communicate()[1][-3000:]
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    step = stopped_after(stderr, "SIGTERM received")
    assert (tmp_path / "ckpt" / f"step_{step}").is_dir() and "Traceback" not in stderr


@pytest.mark.slow
def test_a_finished_command_says_so_and_starts_nothing(tmp_path: Path) -> None:
    argv = checkpointed(tmp_path, "--grpo.max_num_steps", "2")
    first = run(*argv)
    assert first.returncode == 0, first.stderr[-3000:]
    assert stopped_after(first.stderr, "grpo.max_num_steps (2) reached") == 2
    again = run(*argv)
    assert again.returncode == 0, again.stderr[-3000:]
    bundle = tmp_path / "ckpt" / "step_2"
    assert again.stderr.strip() == (
        f"nothing left to train: the newest bundle {bundle} is at step 2, and grpo.max_num_steps is 2; to train "
        "longer, run the same command with a larger --grpo.max_num_steps"
    )
    assert len(list(tmp_path.glob("lightning_logs/version_*"))) == 1  # no Trainer, engine, Ray or data plane


@pytest.mark.parametrize(
    ("knob", "value"),
    [("limit_train_batches", "3"), ("limit_train_batches", "0.5"), ("max_epochs", "2"), ("min_steps", "5")],
)
def test_trainer_limits_that_cannot_end_an_rl_fit_are_refused_naming_the_knob(knob: str, value: str) -> None:
    """The whole run is one Lightning epoch: epoch and batch limits would not end a fit where they say."""
    with pytest.raises(ConfigError, match=rf"trainer.{knob}: is {value}, but the whole RL run is one Lightning epoch"):
        load_and_check([str(REPO / TINY)], [f"trainer.{knob}={value}"])
    load_and_check([str(REPO / TINY)], ["trainer.limit_train_batches=1.0", "trainer.max_time=00:00:10:00"])
