"""The refit gate: dispatch closed for a refit, doomed rollouts aborted, (drain gate) the rest waited for, and the
engine's weight load held to its deadline.

The drain gate (``async_rl.in_flight_weight_updates: false``, ``drain_timeout_s`` here) waits, under its deadline,
until no rollout that passed the dispatch gate is still generating, so every group starts and ends on one weight
version. A colocated engine drains before it stands down (its paused requests would otherwise straddle the refit);
dispatch then stays closed until the refit finishes. The gate drains at every refit, a PPO critic warm-up's too: the
weights do not change there, but the version stamped on rollouts does.

The weights of one version may reach the engine in buckets; one deadline, ``policy.generation.refit_timeout_s``, holds
for the engine's time on all of them together, and each refit starts a fresh one.
"""

from __future__ import annotations

import asyncio
import time

import torch

from sc_lightning.controller.api import DrainTimeout
from sc_lightning.controller.dispatch_gate import DispatchGate
from sc_lightning.controller.samplers import PromptGroupSampler
from sc_lightning.engines.base import EngineError
from sc_lightning.rollout.manager import RolloutManager


class RefitGate:
    """Closes and reopens dispatch around a refit; aborts doomed rollouts; drains the others when the gate is on;
    loads the weights into the engine under the refit's deadline."""

    def __init__(
        self, gate: DispatchGate, manager: RolloutManager, sampler: PromptGroupSampler, drain_timeout_s: float | None
    ) -> None:
        self.gate, self.manager, self.sampler = gate, manager, sampler
        self.drain_timeout_s = drain_timeout_s  # None: refits leave generations in flight
        self.aborting = False  # doomed rollouts are being cancelled: dropped on purpose, not pending
        self._engine_s: dict[int, float] = {}  # the engine's time so far on the refit to a version

    async def close(self, next_version: int) -> int:
        """Close dispatch; cancel the rollouts in flight the sampler says ``next_version`` can never train; how many."""
        self.gate.close()
        doomed = [
            group.task
            for group in list(self.manager.inflight.values())
            if group.task is not None
            and self.sampler.should_abort_inflight(start_weight=group.start_weight, trainer_version=next_version)
        ]
        self.aborting = True  # their prompts are dropped on purpose: a checkpoint must not redispatch them
        try:
            for task in doomed:
                task.cancel()
            await asyncio.gather(*doomed, return_exceptions=True)
        finally:
            self.aborting = False
        return len(doomed)

    async def drain_before_stand_down(self, *, step: int) -> None:
        """Colocated engine, drain gate on: close dispatch (until :meth:`open`) and let the rollouts in flight end."""
        if self.drain_timeout_s is not None:
            self.gate.close()
            await self.drain(step=step)

    async def drain(self, *, step: int) -> None:
        """The drain gate (dispatch closed): wait until no rollout is generating; a no-op when it is off."""
        if self.drain_timeout_s is None:
            return
        try:
            await self.gate.drain(self.drain_timeout_s)
        except TimeoutError:
            stuck = ", ".join(
                f"prompt {group.prompt_id} (group {group_id}, start_weight {group.start_weight})"
                for group_id, group in self.manager.inflight.items()
            )
            raise DrainTimeout(
                f"step {step}: the drain gate (async_rl.in_flight_weight_updates: false) waited past "
                f"async_rl.drain_timeout_s={self.drain_timeout_s} for {self.gate.generating} rollout(s) still "
                f"generating on engine {self.manager.engine.name!r}: {stuck or 'none started yet'}"
            ) from None

    def open(self) -> None:
        """The refit is done: let waiting and new rollouts through."""
        self.gate.open()

    def restart_deadline(self) -> None:
        """A new refit: its buckets share a fresh deadline."""
        self._engine_s.clear()

    async def push_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int, *, last: bool) -> None:
        """Load weights into the engine: the last bucket (or the whole set) through ``update_weights``, when the engine
        adopts ``version``; any other through ``stage_weights``. EngineError past the version's deadline."""
        engine, limit = self.manager.engine, self.manager.settings.refit_timeout_s
        spent = self._engine_s.get(version, 0.0)
        if not last and not hasattr(engine, "stage_weights"):
            raise EngineError(f"engine {engine.name!r} cannot take weights in buckets (it has no stage_weights)")
        load = engine.update_weights(named_tensors, version) if last else engine.stage_weights(named_tensors, version)
        started = time.monotonic()
        try:
            await asyncio.wait_for(load, None if limit is None else max(0.0, limit - spent))  # None: no deadline
        except TimeoutError:
            raise EngineError(
                f"engine {engine.name!r}: the refit to weight version {version} did not finish within "
                f"policy.generation.refit_timeout_s={limit}"
            ) from None
        finally:
            self._engine_s[version] = spent + time.monotonic() - started
