"""FAKE generation engine for tests: scripted completions whose timing and order a test controls.

It stands in for a real engine only in controller/rollout unit tests (the real engines are tested on their own);
it samples nothing. ``respond`` maps (prompt token ids, call index) to completion tokens; with ``gated=True``
every request waits until the test calls ``release(prompt_token_ids)``, so completion order is exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import torch

from sc_lightning.engines.base import EngineError
from sc_lightning.types import Generation, SamplingParams

Responder = Callable[[tuple[int, ...], int], tuple[int, ...]]


def echo_last_token(prompt: tuple[int, ...], call: int) -> tuple[int, ...]:
    """Default script: answer with the prompt's last token twice."""
    return (prompt[-1], prompt[-1])


class ScriptedEngine:
    """FAKE engine: deterministic completions, test-controlled release order, recorded weight updates."""

    name = "scripted"

    def __init__(self, respond: Responder = echo_last_token, *, gated: bool = False, fail_on: int | None = None):
        self.respond = respond
        self.gated = gated
        self.fail_on = fail_on
        self.calls = 0
        self.updates: list[int] = []
        self.staged: list[int] = []  # the version of each bucket staged before its update
        self._version = 0
        self._gates: dict[tuple[int, ...], asyncio.Event] = {}
        self.waiting = 0
        self._arrivals: asyncio.Condition | None = None

    @property
    def weight_version(self) -> int:
        """Version of the weights last pushed."""
        return self._version

    def _gate(self, prompt: tuple[int, ...]) -> asyncio.Event:
        return self._gates.setdefault(prompt, asyncio.Event())

    def _arrival_condition(self) -> asyncio.Condition:
        if self._arrivals is None:
            self._arrivals = asyncio.Condition()
        return self._arrivals

    async def wait_for_requests(self, count: int, timeout_s: float) -> None:
        """Wait until ``count`` requests are parked at their gates (gated mode)."""
        async with self._arrival_condition():
            await asyncio.wait_for(self._arrival_condition().wait_for(lambda: self.waiting >= count), timeout_s)

    def release(self, prompt: tuple[int, ...]) -> None:
        """Let every request of ``prompt`` finish (gated mode); call on the engine's event loop."""
        self._gate(prompt).set()

    def release_all(self) -> None:
        """Let every request waiting so far finish (gated mode); call on the engine's event loop."""
        for gate in self._gates.values():
            gate.set()

    async def generate(self, prompt_token_ids: tuple[int, ...], sampling: SamplingParams) -> Generation:
        """Return the scripted completion (after the prompt is released, in gated mode)."""
        call = self.calls
        self.calls += 1
        if self.fail_on is not None and call == self.fail_on:
            raise EngineError(f"{self.name}: scripted failure on request {call}")
        if self.gated:
            async with self._arrival_condition():
                self.waiting += 1
                self._arrival_condition().notify_all()
            await self._gate(prompt_token_ids).wait()
        tokens = tuple(self.respond(prompt_token_ids, call))[: sampling.max_new_tokens]
        finish = "length" if len(tokens) == sampling.max_new_tokens else "stop"
        return Generation(tokens, tuple(-0.5 for _ in tokens), finish, self._version)

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Record the new version."""
        self._version = version
        self.updates.append(version)

    async def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Record a bucket of ``version`` (the version stays until ``update_weights``)."""
        self.staged.append(version)

    async def stand_down(self) -> None:
        """Nothing to release."""

    async def wake(self) -> None:
        """Nothing to take back."""

    async def shutdown(self) -> None:
        """Nothing to stop."""
