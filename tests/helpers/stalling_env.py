"""Fake environments that stop answering on demand: the arithmetic verifier, except that while the file named by
``SC_TEST_STALL`` exists its ``score`` blocks (at most :data:`STALL_LIMIT_S`; only for prompts from index
``SC_TEST_STALL_FROM`` on, where that is set), and the first blocked call writes that file's ``.stalled`` sibling; and
the calculator, whose episodes of prompts from index ``SC_TEST_STALL_FROM`` on block the same way at their second
step (the conversation's first turn sealed, its answer given). They stand in for
a reward service that hangs, which no real part here can do."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.rollout.envs.base import Score
from sc_lightning.rollout.multiturn.calculator import CalculatorEnvironment, CalculatorEpisode
from sc_lightning.rollout.multiturn.protocol import Observation
from sc_lightning.types import Prompt

STALL_LIMIT_S = 120.0
"""The longest a blocked score waits for the stall file to go: a run nobody stops still ends."""


class StallingArithmetic(ArithmeticEnvironment):
    """The arithmetic verifier that hangs while ``$SC_TEST_STALL`` exists (see the module docstring)."""

    name = "stalling_arithmetic"

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """The arithmetic reward, once the stall file is gone (or after :data:`STALL_LIMIT_S`)."""
        if stalls(prompt, "0"):
            stall_while_asked()
        return super().score(prompt, completion_text)


def stalls(prompt: Prompt, default_from: str) -> bool:
    """Whether ``prompt`` is one that stalls: its index is ``$SC_TEST_STALL_FROM`` (else ``default_from``) or more."""
    return prompt.index is not None and prompt.index >= int(os.environ.get("SC_TEST_STALL_FROM", default_from))


def stall_while_asked() -> None:
    """Block while ``$SC_TEST_STALL`` exists (at most :data:`STALL_LIMIT_S`), touching its ``.stalled`` sibling."""
    stall = Path(os.environ["SC_TEST_STALL"])
    deadline = time.monotonic() + STALL_LIMIT_S
    if stall.exists():
        stall.with_suffix(".stalled").touch()
    while stall.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the fake hang itself


class StallingCalculator(CalculatorEnvironment):
    """The calculator whose episodes of prompts from index ``$SC_TEST_STALL_FROM`` on stall at their second step."""

    name = "stalling_calculator"

    def start(self, prompt: Prompt) -> StallingEpisode:
        """A calculator episode that stalls at its second step if ``prompt`` is one of those."""
        return StallingEpisode(super().start(prompt), stalls(prompt, os.environ["SC_TEST_STALL_FROM"]))


class StallingEpisode:
    """A calculator episode that, if ``stalls``, blocks at its second step while ``$SC_TEST_STALL`` exists."""

    def __init__(self, episode: CalculatorEpisode, stalls: bool) -> None:
        self.episode, self.stalls, self.steps = episode, stalls, 0

    def step(self, model_text: str) -> Observation | Score:
        """The calculator's step, after the stall at the second one."""
        self.steps += 1
        if self.stalls and self.steps == 2:
            stall_while_asked()
        return self.episode.step(model_text)
