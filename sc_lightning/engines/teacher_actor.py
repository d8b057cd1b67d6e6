"""A distillation teacher in a Ray actor of its own (``on_policy_distillation.teachers.<alias>.colocated: false``).

:class:`RayTeacher` is the client: it starts one actor (its ``num_cpus`` / ``num_gpus``) that loads a
:class:`~sc_lightning.models.teacher.TeacherModel` (checking its tokenizer against the policy's there; the start
fails with that error) and scores sequences on request, from any asyncio loop of the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sc_lightning.engines.actor_client import ActorEngineClient
from sc_lightning.engines.base import EngineError
from sc_lightning.engines.megatron.ray_engine import leave_driver_world


class TeacherActor:
    """The Ray actor body: one :class:`~sc_lightning.models.teacher.TeacherModel` built in the actor process."""

    def __init__(self, alias: str, model_name: str, options: dict[str, Any]) -> None:
        from sc_lightning.models.megatron_import import import_megatron_without_compile

        import_megatron_without_compile()  # this actor process's first megatron import
        from sc_lightning.models.teacher import TeacherModel

        leave_driver_world()
        self.teacher = TeacherModel(alias, model_name, **options)

    def ready(self) -> int:
        """The teacher's vocabulary size, once it is loaded (the client waits for it)."""
        return self.teacher.spec.vocab_size

    def logprobs(self, sequences: list[tuple[int, ...]], temperature: float) -> list[torch.Tensor]:
        """``TeacherModel.logprobs`` in the actor."""
        return self.teacher.logprobs(sequences, temperature)


class RayTeacher:
    """A :class:`~sc_lightning.rollout.teachers.TeacherScorer` whose model runs in a Ray actor."""

    def __init__(
        self,
        alias: str,
        model_name: str,
        *,
        num_cpus: float,
        num_gpus: float,
        startup_timeout_s: float = ActorEngineClient.startup_timeout_s,
        **options: Any,
    ) -> None:
        """Start the actor and wait until its teacher is loaded (its loading error, if any, raised here); EngineError
        naming the teacher and what it asked for when it is not loaded within ``startup_timeout_s`` (Ray cannot
        place it, or the load hangs). ``options`` go to :class:`~sc_lightning.models.teacher.TeacherModel`. Ray must
        be initialised."""
        import ray

        actor_class = ray.remote(TeacherActor).options(num_cpus=num_cpus, num_gpus=num_gpus)
        self.actor = actor_class.remote(alias, model_name, options)
        try:
            ray.get(self.actor.ready.remote(), timeout=startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actor)
            raise EngineError(
                f"teacher {alias!r} ({model_name}) was not loaded within {startup_timeout_s:.0f} s: Ray could not give "
                f"its actor {num_cpus} CPU(s) and {num_gpus} GPU(s), or loading hung; check the cluster's free "
                "resources (ray status) or run it colocated"
            ) from None

    async def score(self, sequences: Sequence[Sequence[int]], *, temperature: float) -> list[torch.Tensor]:
        """The actor's logprobs of ``sequences`` (a dead actor raises Ray's error: an infra failure)."""
        return await self.actor.logprobs.remote([tuple(ids) for ids in sequences], temperature)

    async def shutdown(self) -> None:
        """Kill the actor."""
        import ray

        ray.kill(self.actor)
