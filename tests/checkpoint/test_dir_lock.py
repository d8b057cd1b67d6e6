"""One run per checkpoint directory: a second one is refused naming the holder; a killed holder frees it at once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sc_lightning.checkpoint.dir_lock import CheckpointDirInUse, CheckpointDirLock
from tests.helpers.cli import checkpointed, run, start

HOLD = "import sys; from pathlib import Path; from sc_lightning.checkpoint.dir_lock import CheckpointDirLock; " \
    "CheckpointDirLock(Path(sys.argv[1])).acquire(); print('held', flush=True); sys.stdin.read()"  # fmt: skip


def test_a_second_holder_is_refused_naming_the_first_and_sigkill_frees_the_directory(tmp_path: Path) -> None:
    holder = start(
        [sys.executable, "-c", HOLD, str(tmp_path / "ckpt")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(CheckpointDirInUse) as refused:
            CheckpointDirLock(tmp_path / "ckpt").acquire()
        assert f"checkpointing.checkpoint_dir={str(tmp_path / 'ckpt')!r} is in use by another run " in str(
            refused.value
        )
        assert f"(pid {holder.pid} on {socket.gethostname()}, since " in str(refused.value)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        holder.kill()
    # the OS released the dead holder's lock
    with CheckpointDirLock(tmp_path / "ckpt"), pytest.raises(CheckpointDirInUse, match=f"pid {os.getpid()} on"):
        CheckpointDirLock(tmp_path / "ckpt").acquire()
    CheckpointDirLock(tmp_path / "ckpt").acquire().release()  # and this one's, on release


def test_a_directory_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointDirInUse, match=r"checkpoint_dir='.*/file/ckpt' cannot be used: "):
        CheckpointDirLock(tmp_path / "file" / "ckpt").acquire()


@pytest.mark.slow
def test_fit_on_a_directory_another_run_holds_fails_at_start_with_one_error_line(tmp_path: Path) -> None:
    with CheckpointDirLock(tmp_path / "ckpt"):
        result = run(*checkpointed(tmp_path, "--grpo.max_num_steps", "2"))
    assert result.returncode == 2, result.stderr[-3000:]
    where = str(tmp_path / "ckpt")
    assert result.stderr.startswith(
        f"error: checkpointing.checkpoint_dir={where!r} is in use by another run (pid {os.getpid()} on "
    )
    assert len(result.stderr.strip().splitlines()) == 1 and not list(tmp_path.glob("lightning_logs"))
