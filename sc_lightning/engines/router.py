"""Several engine replicas behind one :class:`~sc_lightning.engines.base.GenerationEngine`: routing and health.

:class:`EngineRouter` sends each request to the healthy replica with the fewest requests *left unanswered* since its
last answer (abandoned before an answer: a deadline fired, or the group was aborted), then the fewest outstanding
(ties: the lowest index) — so a replica that hangs without dying stops getting requests while others answer. It
refits every healthy replica concurrently, and tracks health: a replica whose Ray actor died is marked dead at its
first failing call (a request, or a refit when it died while idle) — a failing request's error names the replica —
and gets no more requests; a refit that finds a replica dead succeeds on the survivors. Errors inside a healthy
replica (a bad request) leave it healthy. With no healthy replica left, every call fails fast with an
:class:`~sc_lightning.engines.base.EngineError` listing the dead ones. Retrying a failed request elsewhere is the
rollout layer's job (``async_rl.rollout_failure``), not the router's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from sc_lightning.engines.base import EngineError, GenerationEngine
from sc_lightning.types import Generation, SamplingParams

DEATH_MARKERS = ("actor died", "is shut down")
UNANSWERED_WARNING = 3  # requests abandoned in a row before the router says it is routing around a replica
log = logging.getLogger(__name__)


def is_replica_death(error: EngineError) -> bool:
    """Whether ``error`` says the replica itself is gone (not that one request failed)."""
    return any(marker in str(error) for marker in DEATH_MARKERS)


class EngineRouter:
    """Least-outstanding-requests routing over engine replicas, with per-replica health."""

    def __init__(self, replicas: Sequence[GenerationEngine], *, name: str = "router") -> None:
        if not replicas:
            raise ValueError("an engine router needs at least one replica")
        names = [replica.name for replica in replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replica names must be unique to attribute errors, got {names}")
        self.name = name
        self.replicas = list(replicas)
        self.outstanding = [0] * len(replicas)
        self.unanswered = [0] * len(replicas)  # requests abandoned (cancelled) since the replica's last answer
        self.dead: dict[str, str] = {}  # replica name -> why it was marked dead

    @property
    def weight_version(self) -> int:
        """The lowest weight version among healthy replicas (all equal between refits)."""
        return min(replica.weight_version for replica in self._healthy())

    def _healthy(self) -> list[GenerationEngine]:
        healthy = [replica for replica in self.replicas if replica.name not in self.dead]
        if not healthy:
            why = "; ".join(f"{name}: {reason}" for name, reason in self.dead.items())
            raise EngineError(f"engine {self.name!r}: no healthy replica left ({why})")
        return healthy

    def _mark(self, replica: GenerationEngine, error: EngineError) -> None:
        if is_replica_death(error):
            self.dead.setdefault(replica.name, str(error))

    def pick(self) -> int:
        """Index of the healthy replica with the fewest unanswered, then outstanding, requests."""
        healthy = {replica.name for replica in self._healthy()}
        candidates = [i for i, replica in enumerate(self.replicas) if replica.name in healthy]
        return min(candidates, key=lambda i: (self.unanswered[i], self.outstanding[i], i))

    async def generate(self, prompt_token_ids: tuple[int, ...], sampling: SamplingParams, **kwargs: Any) -> Generation:
        """Sample one completion on the least-loaded healthy replica."""
        index = self.pick()
        replica = self.replicas[index]
        self.outstanding[index] += 1
        try:
            generation = await replica.generate(prompt_token_ids, sampling, **kwargs)
        except EngineError as error:
            self._mark(replica, error)
            raise
        except asyncio.CancelledError:  # abandoned: a deadline fired, or its group was aborted or failed elsewhere
            self.unanswered[index] += 1
            if self.unanswered[index] == UNANSWERED_WARNING:
                log.warning(
                    "engine %r: replica %r left %d requests in a row unanswered (deadlines or aborts); routing new "
                    "requests to the replicas that answer",
                    self.name,
                    replica.name,
                    UNANSWERED_WARNING,
                )
            raise
        else:
            self.unanswered[index] = 0
            return generation
        finally:
            self.outstanding[index] -= 1

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Refit every healthy replica concurrently.

        A replica found dead here (it died while idle) is marked dead like at a failing request, and the refit
        succeeds on the survivors; with none left it fails listing the dead. Any other failure is raised (the
        first one; it names its replica).
        """
        await self._on_every_replica("update_weights", named_tensors, version)

    async def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """One bucket of a refit to every healthy replica concurrently (failures as in :meth:`update_weights`)."""
        await self._on_every_replica("stage_weights", named_tensors, version)

    async def _on_every_replica(
        self, method: str, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Call a refit ``method`` on every healthy replica concurrently; mark the dead, raise the first failure."""
        tensors = list(named_tensors)  # every replica reads the same tensors
        replicas = self._healthy()
        results = await asyncio.gather(
            *(getattr(replica, method)(tensors, version) for replica in replicas), return_exceptions=True
        )
        failures = [(r, e) for r, e in zip(replicas, results, strict=True) if isinstance(e, BaseException)]
        for replica, error in failures:
            if isinstance(error, EngineError):
                self._mark(replica, error)
        fatal = [error for replica, error in failures if replica.name not in self.dead]
        if fatal:
            raise fatal[0]
        self._healthy()  # every replica died: fail listing them

    async def stand_down(self) -> None:
        """Stand every healthy replica down."""
        await asyncio.gather(*(replica.stand_down() for replica in self._healthy()))

    async def wake(self) -> None:
        """Wake every healthy replica."""
        await asyncio.gather(*(replica.wake() for replica in self._healthy()))

    async def shutdown(self) -> None:
        """Shut every replica down (dead ones too: their clients release what they hold); idempotent."""
        await asyncio.gather(*(replica.shutdown() for replica in self.replicas), return_exceptions=True)
