"""A fake environment that stops answering on demand: the arithmetic verifier, except that while the file named by
``SC_TEST_STALL`` exists its ``score`` blocks (at most :data:`STALL_LIMIT_S`), and the first blocked call writes
that file's ``.stalled`` sibling. It stands in for a reward service that hangs, which no real part here can do."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.types import Prompt

STALL_LIMIT_S = 120.0
"""The longest a blocked score waits for the stall file to go: a run nobody stops still ends."""


class StallingArithmetic(ArithmeticEnvironment):
    """The arithmetic verifier that hangs while ``$SC_TEST_STALL`` exists (see the module docstring)."""

    name = "stalling_arithmetic"

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """The arithmetic reward, once the stall file is gone (or after :data:`STALL_LIMIT_S`)."""
        stall = Path(os.environ["SC_TEST_STALL"])
        deadline = time.monotonic() + STALL_LIMIT_S
        if stall.exists():
            stall.with_suffix(".stalled").touch()
        while stall.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the fake hang itself
        return super().score(prompt, completion_text)
