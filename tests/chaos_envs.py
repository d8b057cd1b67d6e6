"""Environments for the chaos tests, importable by a training subprocess as ``env.name: tests.chaos_envs:Class``."""

from __future__ import annotations

import hashlib
import os

from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.rollout.envs.base import RewardError

GENERATIONS = 4  # the tests' groups: tests/small_steps.yaml
FAILURE_RATE = 0.2


def attempt_fails(seed: int, prompt_id: str, attempt: int) -> bool:
    """Whether scoring attempt ``attempt`` of ``prompt_id`` is one of the injected failures (20%, seeded)."""
    digest = hashlib.blake2b(f"{seed}/{prompt_id}/{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < FAILURE_RATE


class FlakyArithmetic(ArithmeticEnvironment):
    """The arithmetic verifier, failing 20% of scoring attempts (a RewardError at the attempt's first completion).

    Which attempts fail is a function of ``$SC_CHAOS_SEED``, the prompt and the attempt's number, whatever the
    timing; each injected failure is appended to ``$SC_CHAOS_FAULT_LOG`` as ``prompt_id attempt``.
    """

    name = "flaky-arithmetic"

    def __init__(self) -> None:
        super().__init__()
        self.seed = int(os.environ["SC_CHAOS_SEED"])
        self.log_path = os.environ["SC_CHAOS_FAULT_LOG"]
        self.attempts: dict[str, int] = {}  # prompt -> attempts begun
        self.position: dict[str, int] = {}  # prompt -> completions scored in the current attempt

    def score(self, prompt, completion_text):
        """Fail the attempt at its first completion if the seed says so; else verify."""
        pid = prompt.prompt_id
        position = self.position.get(pid, 0)
        if position == 0:
            self.attempts[pid] = self.attempts.get(pid, 0) + 1
            if attempt_fails(self.seed, pid, self.attempts[pid]):
                with open(self.log_path, "a") as log:
                    log.write(f"{pid} {self.attempts[pid]}\n")
                raise RewardError(f"prompt {pid}: injected failure of attempt {self.attempts[pid]}")
        self.position[pid] = (position + 1) % GENERATIONS
        return super().score(prompt, completion_text)
