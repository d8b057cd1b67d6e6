"""A distillation teacher in a Ray actor of its own (``on_policy_distillation.teachers.<alias>.colocated: false``).

:class:`RayTeacher` is the client: it starts one actor (its ``num_cpus`` / ``num_gpus``) that loads a
:class:`~sc_lightning.models.teacher.TeacherModel` (checking its tokenizer against the policy's there; the start
fails with that error) and scores sequences on request, from any asyncio loop of the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

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

    def __init__(self, alias: str, model_name: str, *, num_cpus: float, num_gpus: float, **options: Any) -> None:
        """Start the actor and wait until its teacher is loaded (its loading error, if any, raised here); ``options``
        go to :class:`~sc_lightning.models.teacher.TeacherModel`. Ray must be initialised."""
        import ray

        actor_class = ray.remote(TeacherActor).options(num_cpus=num_cpus, num_gpus=num_gpus)
        self.actor = actor_class.remote(alias, model_name, options)
        ray.get(self.actor.ready.remote())

    async def score(self, sequences: Sequence[Sequence[int]], *, temperature: float) -> list[torch.Tensor]:
        """The actor's logprobs of ``sequences`` (a dead actor raises Ray's error: an infra failure)."""
        return await self.actor.logprobs.remote([tuple(ids) for ids in sequences], temperature)

    async def shutdown(self) -> None:
        """Kill the actor."""
        import ray

        ray.kill(self.actor)
