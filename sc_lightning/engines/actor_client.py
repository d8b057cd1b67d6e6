"""The driver side of an engine that lives in a Ray actor: calls with attributable errors, refits, shutdown.

:class:`ActorEngineClient` holds what :class:`~sc_lightning.engines.megatron_ray.RayMegatronEngine` and
:class:`~sc_lightning.engines.vllm.VLLMEngine` share: the actor handle, the weight version as of the last refit,
``generate`` / ``update_weights`` / ``stats`` / ``ready`` forwarded to the actor (whose body implements them), Ray
failures turned into :class:`~sc_lightning.engines.base.EngineError` naming the engine and the call, and a
``shutdown`` that stops the engine in the actor and then kills the actor. Subclasses start the actor.

Every call has a deadline: requests and refits carry their callers' (``generation_timeout_s``,
``refit_timeout_s``); startup, ``stats`` and ``shutdown`` have the client's own (``startup_timeout_s``,
``control_timeout_s``): a hung actor is an EngineError, and a shutdown that gets no answer kills the actor anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from sc_lightning.engines.base import EngineError
from sc_lightning.types import Generation, SamplingParams


class ActorEngineClient:
    """A :class:`GenerationEngine` forwarding to a Ray actor (``_actor``) that serves the same methods."""

    name: str
    _actor: Any
    startup_timeout_s: float = 1800.0  # building the model in the actor (a large model on a GPU takes minutes)
    control_timeout_s: float = 60.0  # stats and shutdown

    def __init__(self, name: str, actor: Any, weight_version: int = 0) -> None:
        self.name, self._actor, self._version = name, actor, weight_version
        self._requests = 0

    @property
    def weight_version(self) -> int:
        """Version of the weights loaded in the actor (as of the last ``update_weights``)."""
        return self._version

    @property
    def actor(self) -> Any:
        """The Ray actor handle (None after ``shutdown``)."""
        return self._actor

    async def _call(self, what: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Await ``method`` of the actor (within ``timeout_s``, None: the caller's deadline holds); Ray failures and
        an expired deadline become EngineError naming the engine and ``what``."""
        if self._actor is None:
            raise EngineError(f"engine {self.name!r}, {what}: the engine is shut down")
        with self._ray_errors(what):
            try:
                return await asyncio.wait_for(getattr(self._actor, method).remote(*args), timeout_s)
            except TimeoutError:
                raise EngineError(f"engine {self.name!r}, {what}: no answer within {timeout_s} s") from None

    @contextlib.contextmanager
    def _ray_errors(self, what: str) -> Iterator[None]:
        """Ray's failures of a call to the actor, as EngineError naming the engine and ``what``."""
        import ray

        try:
            yield
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as err:
            raise self._engine_error(what, err) from err

    def _engine_error(self, what: str, err: Exception) -> EngineError:
        """``err``, a Ray failure of a call to the actor, as an EngineError naming the engine and ``what``; an
        EngineError raised by the engine keeps its message, which already names both."""
        import ray

        if isinstance(err, ray.exceptions.RayActorError):
            return EngineError(f"engine {self.name!r}, {what}: the engine actor died: {err}")
        cause = getattr(err, "cause", None)
        if isinstance(cause, EngineError):
            return EngineError(str(cause))
        return EngineError(f"engine {self.name!r}, {what}: {cause or err}")

    async def ready(self) -> None:
        """Wait until the actor has built its engine."""
        await self._call("startup", "ready", timeout_s=self.startup_timeout_s)

    async def generate(
        self, prompt_token_ids: tuple[int, ...], sampling: SamplingParams, *, stop_token_ids: Iterable[int] = ()
    ) -> Generation:
        """Sample one completion in the actor."""
        self._requests += 1
        what = f"client request {self._requests}"
        return await self._call(what, "generate", tuple(prompt_token_ids), sampling, tuple(stop_token_ids))

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Ship HF-named tensors to the actor by value (one ``ray.put``) and load them there as ``version``."""
        self._version = await self._call(
            f"refit to version {version}", "update_weights", _by_value(named_tensors), version
        )

    async def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Ship one bucket of ``version``'s HF-named tensors to the actor (more follow); the version stays."""
        await self._call(f"refit to version {version} (a bucket)", "stage_weights", _by_value(named_tensors), version)

    async def stats(self) -> dict[str, int]:
        """The actor engine's counters."""
        return await self._call("stats", "stats", timeout_s=self.control_timeout_s)

    async def shutdown(self) -> None:
        """Stop the engine in the actor, then kill the actor; idempotent."""
        import ray

        actor, self._actor = self._actor, None
        if actor is None:
            return
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):  # dead or hung: killed below anyway
            await asyncio.wait_for(actor.shutdown.remote(), self.control_timeout_s)
        ray.kill(actor, no_restart=True)


def _by_value(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Any:
    """The tensors as one object in Ray's store, on the CPU (what an actor's refit method receives)."""
    import ray

    return ray.put([(name, tensor.detach().to("cpu", copy=True).contiguous()) for name, tensor in named_tensors])
