"""Ctrl-C on ``python -m sc_lightning fit`` at any moment: a graceful stop, one ``interrupted`` line, exit code 130.

Each test starts the real command in its own process group and, when a known line shows on its stderr, sends SIGINT
to the group as a terminal's Ctrl-C does. Nothing after the signal may be a traceback or asyncio's shut-down noise.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import start, user_environment
from tests.helpers.configs import TINY

pytestmark = pytest.mark.slow

QUICK = ("--config", TINY, "--config", "configs/colocated.yaml", "--data_plane.backend", "memory")
NOISE = ("Traceback", "Task was destroyed", "Event loop is closed", "Exception ignored", "Error")


def interrupt_on(line: str, *args: str, verbose: bool) -> tuple[int, str]:
    """Run ``fit *args`` and Ctrl-C it when ``line`` shows on stderr; its exit code and stderr from that line on."""
    env = user_environment()
    if verbose:  # every library's own output: lines that show where the start-up is
        env["SC_LIGHTNING_VERBOSE"] = "1"
    command = [sys.executable, "-m", "sc_lightning", "fit", *args, "--trainer.enable_progress_bar=false"]
    process = start(  # the verbose case interrupts a fresh interpreter's imports: a new process
        command,
        env=env,
        fresh=verbose,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    before: list[str] = []
    try:
        assert process.stderr is not None
        for text in process.stderr:
            if line in text:
                os.killpg(process.pid, signal.SIGINT)
                rest = process.communicate(timeout=300)[1]
                return process.returncode, text + rest
            before.append(text)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    raise AssertionError(f"the run ended (exit code {process.wait()}) without printing {line!r}:\n{''.join(before)}")


@pytest.mark.parametrize(
    ("line", "args", "verbose"),
    [
        ("", QUICK, True),  # the first line: megatron-core's import-time warnings, which swallow a KeyboardInterrupt
        ("  checkpoints: ", (*QUICK[:2], "--data_plane.backend", "memory"), False),  # the banner: training starts
    ],
    ids=["imports", "banner"],
)
def test_ctrl_c_stops_the_run_with_exit_code_130_and_one_line(
    line: str, args: tuple[str, ...], verbose: bool, tmp_path: Path
) -> None:
    code, stderr = interrupt_on(
        line, *args, "--grpo.max_num_steps=50", f"--trainer.default_root_dir={tmp_path}", verbose=verbose
    )
    assert code == 130, stderr[-3000:]
    assert not [word for word in NOISE if word in stderr], stderr[-3000:]
    after = [text for text in stderr.strip().splitlines()[1:] if text]
    if after and after[0].startswith("SIGINT received: stopping after the step in progress"):
        # the banner is printed just before training starts: a signal that lands once it has started stops the fit
        # after its step (FitStop), and the stop line says so
        assert re.fullmatch(r"fit stopped after step \d+: SIGINT received.*", after[-1]), stderr[-3000:]
        assert len(after) == 2, stderr[-3000:]
        return
    assert after[-1] == "interrupted", stderr[-3000:]
    if not verbose:
        assert after == ["interrupted"], stderr  # the banner's last line, then just that
