"""Non-colocated Megatron generation: a :class:`MegatronEngine` in its own Ray actor, behind an asyncio client.

:class:`RayMegatronEngine` implements :class:`~sc_lightning.engines.base.GenerationEngine` from any asyncio loop of
the driver: it starts one actor (``num_cpus`` / ``num_gpus`` of it; CPU-only by default) that builds its own replica
from ``(model_name, precision, seed)`` and serves the same protocol, many requests concurrently (an async actor).
Requests travel in batches (see :mod:`~sc_lightning.engines.actor_client`). Weights travel by value:
``update_weights`` copies the tensors to CPU and ships them in one ``ray.put`` (as numpy arrays); after
``open_weight_group`` they travel by broadcast instead, device to device over NCCL between GPUs
(:mod:`~sc_lightning.engines.weight_group`). Errors of the actor
come back as :class:`~sc_lightning.engines.base.EngineError` naming the engine and the request; ``shutdown()`` kills
the actor.
Ray must be initialised by the caller (``ray.init``) before the client is built.

The client keeps its own :class:`~sc_lightning.engines.megatron.clock.ActiveClock` (paused by ``stand_down``), so
``active_deadline`` / ``active_wait_for`` work as on the in-process engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import torch

from sc_lightning.engines.actor_client import (
    ActorEngineClient,
    BatchedGenerateActor,
    ShippedWeights,
    received_weights,
)
from sc_lightning.engines.base import EngineError
from sc_lightning.engines.megatron.clock import ActiveClock
from sc_lightning.engines.weight_group import (
    TensorMeta,
    WeightGroup,
    WeightGroupAddress,
    WeightGroupHost,
    tensor_metas,
)
from sc_lightning.models.policy_source import model_spec, policy_tokenizer
from sc_lightning.models.spec import ModelSpec
from sc_lightning.types import Generation, SamplingParams

T = TypeVar("T")


# torch.distributed rendezvous variables a worker may inherit from its driver (whose torchrun or lone-process group
# owns that port): the actor is a world of its own, so it drops them and starts a world of one.
_INHERITED_DIST_VARS = ("MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def leave_driver_world() -> None:
    """In an actor process without torch.distributed yet: drop the rendezvous variables inherited from the driver, so
    the models built here start a world of their own."""
    if not torch.distributed.is_initialized():
        for var in _INHERITED_DIST_VARS:
            os.environ.pop(var, None)


class MegatronEngineActor(BatchedGenerateActor):
    """The Ray actor body: one :class:`MegatronEngine` built in the actor process, its protocol as async methods."""

    def __init__(
        self, model_name: str, spec: ModelSpec, eos_token_id: int | None, precision: str, seed: int, kwargs: dict
    ) -> None:
        from sc_lightning.models.megatron_import import import_megatron_without_compile

        import_megatron_without_compile()  # this actor process's first megatron import
        from sc_lightning.engines.megatron.engine import MegatronEngine

        leave_driver_world()

        super().__init__()
        self.engine = MegatronEngine.from_spec(
            model_name, spec, eos_token_id=eos_token_id, precision=precision, seed=seed, **kwargs
        )
        self._weight_group: WeightGroup | None = None  # refits by broadcast once joined

    async def ready(self) -> int:
        """The weight version once the model is built (callers await it to know the actor is up)."""
        return self.engine.weight_version

    async def generate(
        self,
        prompt_token_ids: tuple[int, ...],
        sampling: SamplingParams,
        stop_token_ids: tuple[int, ...],
        images: torch.Tensor | None = None,
    ) -> Generation:
        """``MegatronEngine.generate`` in the actor (one request of a ``generate_batch`` call), with the prompt's
        images (a vision-language policy)."""
        return await self.engine.generate(prompt_token_ids, sampling, stop_token_ids=stop_token_ids, images=images)

    async def update_weights(self, shipped: ShippedWeights, version: int) -> int:
        """``MegatronEngine.update_weights`` in the actor; returns the version now loaded."""
        await self.engine.update_weights(received_weights(shipped), version)
        return self.engine.weight_version

    async def stage_weights(self, shipped: ShippedWeights, version: int) -> None:
        """``MegatronEngine.stage_weights`` in the actor."""
        await self.engine.stage_weights(received_weights(shipped), version)

    async def join_weight_group(self, address: WeightGroupAddress, rank: int) -> None:
        """Join the leader's weight group as ``rank``: refits come by broadcast from then on
        (:meth:`receive_weights`)."""
        self._weight_group = await asyncio.to_thread(WeightGroup.join, address, rank, self.engine.device)

    async def receive_weights(self, metas: list[TensorMeta], version: int, last: bool) -> int:
        """Receive the tensors ``metas`` lists by broadcast and load them as ``version`` (``last``: the whole set,
        or its last bucket; else one bucket, more to follow); returns the version now loaded."""
        if self._weight_group is None:
            raise RuntimeError("receive_weights before join_weight_group: no weight group to receive from")
        named = await asyncio.to_thread(self._weight_group.receive, metas)
        if last:
            await self.engine.update_weights(named, version)
        else:
            await self.engine.stage_weights(named, version)
        return self.engine.weight_version

    async def stand_down(self) -> None:
        """``MegatronEngine.stand_down`` in the actor."""
        await self.engine.stand_down()

    async def wake(self) -> None:
        """``MegatronEngine.wake`` in the actor."""
        await self.engine.wake()

    async def shutdown(self) -> None:
        """``MegatronEngine.shutdown`` in the actor (the client kills the actor afterwards)."""
        await self.engine.shutdown()

    async def stats(self) -> dict[str, float]:
        """The engine's counters as a dict."""
        return dict(vars(self.engine.stats))


class RayMegatronEngine(ActorEngineClient):
    """A :class:`GenerationEngine` client of a :class:`MegatronEngineActor` (non-colocated placement).

    ``engine_kwargs`` go to :class:`MegatronEngine` in the actor (``max_batch_size``, ``max_seq_len``,
    ``extra_stop_token_ids``, ``stop_on_eos``, ``weight_version``). ``actor_name`` registers the actor under that
    name in Ray (default: none).
    """

    def __init__(
        self,
        model_name: str,
        *,
        precision: str = "fp32",
        seed: int = 0,
        tokenizer_name: str | None = None,
        name: str = "megatron-ray",
        num_cpus: float = 1,
        num_gpus: float = 0,
        actor_name: str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        import ray

        self._clock = ActiveClock()
        engine_kwargs.setdefault("name", name)
        actor_class = ray.remote(MegatronEngineActor)
        options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_concurrency": 10_000}
        if actor_name is not None:
            options["name"] = actor_name
        # the architecture and the stop token are read here, where transformers is imported anyway: the actor
        # process builds its replica from them and never imports transformers (seconds of every engine start)
        spec = model_spec(model_name)
        eos_token_id = policy_tokenizer(model_name, tokenizer_name).eos_token_id
        actor = actor_class.options(**options).remote(model_name, spec, eos_token_id, precision, seed, engine_kwargs)
        super().__init__(name, actor, int(engine_kwargs.get("weight_version", 0)))
        self._weight_group: WeightGroup | None = None  # refits by value until open_weight_group

    def active_deadline(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[None]:
        """``asyncio.timeout(seconds)`` counting only the time the engine is awake (raises ``TimeoutError``)."""
        return self._clock.deadline(seconds)

    async def active_wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        """``asyncio.wait_for(awaitable, timeout)`` counting only the time the engine is awake."""
        return await self._clock.wait_for(awaitable, timeout)

    async def open_weight_group(self, device: torch.device | str = "cpu", *, timeout_s: float = 600.0) -> None:
        """Refit by broadcast from now on: open a weight group of this process (on ``device``) and the actor, over
        NCCL between GPUs, gloo on CPUs (:mod:`~sc_lightning.engines.weight_group`); its collectives time out after
        ``timeout_s``."""
        import ray

        host = WeightGroupHost(2, device, host=ray.util.get_node_ip_address(), timeout_s=timeout_s)
        joined = self._call("join the weight group", "join_weight_group", host.address, 1, timeout_s=timeout_s)
        self._weight_group, _ = await asyncio.gather(asyncio.to_thread(host.connect), joined)

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load HF-named tensors in the actor as ``version``: by broadcast once a weight group is open, else by value
        through Ray's object store."""
        if self._weight_group is None:
            return await super().update_weights(named_tensors, version)
        self._version = await self._broadcast(named_tensors, version, last=True)

    async def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load one bucket of ``version``'s HF-named tensors in the actor (more follow), by broadcast once a weight
        group is open, else by value."""
        if self._weight_group is None:
            return await super().stage_weights(named_tensors, version)
        await self._broadcast(named_tensors, version, last=False)

    async def _broadcast(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, last: bool) -> int:
        """Send the tensors through the weight group while the actor receives them; the version it then holds."""
        assert self._weight_group is not None
        named = list(named_tensors)
        what = f"refit to version {version}" + ("" if last else " (a bucket)")
        received = self._call(what, "receive_weights", tensor_metas(named), version, last)
        sent = asyncio.to_thread(self._weight_group.send, [tensor for _, tensor in named])
        try:
            _, loaded = await asyncio.gather(sent, received)
        except EngineError:
            raise  # the actor's side, named already
        except RuntimeError as err:  # the collective's own failure (a deadline, a dead peer): the engine's to name
            raise EngineError(f"engine {self.name!r}, {what}: the broadcast failed: {err}") from err
        return loaded

    async def stand_down(self) -> None:
        """Pause the actor's decoding and the client's active clock."""
        self._clock.pause()
        await self._call("stand_down", "stand_down")

    async def wake(self) -> None:
        """Resume the actor's decoding and the client's active clock."""
        await self._call("wake", "wake")
        self._clock.resume()
