"""A damaged newest bundle (a flipped bit, a deleted file) is skipped for the newest valid one: the same command
resumes from it with a warning naming the damaged one, which it keeps (moved aside when the run writes that step
again), and every prompt is trained exactly once. Every kind of damage is told apart, truncation included, in
tests/checkpoint/test_atomic.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sc_lightning.checkpoint.atomic import verify_bundle
from sc_lightning.checkpoint.bundle import TRAINER_FILE
from tests.helpers.cli import run
from tests.helpers.configs import TEST_BASE
from tests.helpers.recovery import assert_each_prompt_trained_once, command, write_dataset

pytestmark = pytest.mark.slow


def flip_a_bit(bundle: Path) -> None:
    data = bytearray((bundle / TRAINER_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (bundle / TRAINER_FILE).write_bytes(bytes(data))


def delete_a_file(bundle: Path) -> None:
    (bundle / "controller_state.json").unlink()


def files_of(bundle: Path) -> dict[Path, bytes]:
    """Every file of ``bundle`` and its bytes."""
    return {p.relative_to(bundle): p.read_bytes() for p in bundle.rglob("*") if p.is_file()}


@pytest.mark.parametrize("damage", [flip_a_bit, delete_a_file], ids=lambda f: f.__name__)
def test_a_damaged_newest_bundle_is_skipped_for_the_newest_valid_one(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    write_dataset(tmp_path / "prompts.jsonl")
    argv = command(tmp_path, TEST_BASE, "--data_plane.backend", "memory", "--checkpointing.save_period", "2")
    first = run(*argv[3:], "--grpo.max_num_steps", "6", timeout_s=600)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoints = tmp_path / "checkpoints"
    damage(checkpoints / "step_6")
    damaged = files_of(checkpoints / "step_6")
    again = run(*argv[3:], timeout_s=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"skipping the damaged bundle {checkpoints / 'step_6'}" in again.stderr
    assert f"resuming from {checkpoints / 'step_4'}" in again.stderr
    (aside,) = checkpoints.glob("step_6.damaged-*")  # the run wrote step 6 again; the damaged one is kept, as it was
    assert files_of(aside) == damaged
    verify_bundle(checkpoints / "step_6")
    assert_each_prompt_trained_once(tmp_path)
