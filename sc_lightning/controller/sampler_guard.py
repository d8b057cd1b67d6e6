"""GuardedSampler: a custom sampler behind checks, so its bugs surface as errors that name it and the call.

A custom sampler (``async_rl.sampler.name: custom``) is user code running inside the controller. A raised
exception or a result of the wrong shape there would otherwise surface as a bare traceback from deep inside the
rollout pump or the trainer's ``select``, or worse, as a silent stall. The guard names the sampler's class, the
call and its arguments; it checks that ``select`` returns None or between ``min_groups`` and ``max_groups``
groups, that ``evict`` returns a list, ``admit`` an int or None and ``can_admit`` a bool. Every other attribute is
passed through unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sc_lightning.controller.api import GroupMeta

if TYPE_CHECKING:
    from sc_lightning.controller.samplers import PromptGroupSampler


class CustomSamplerFailure(RuntimeError):
    """A custom sampler raised, or returned something of the wrong shape; names the sampler and the call."""


class GuardedSampler:
    """Wraps a custom sampler: its exceptions and malformed results become SamplerErrors naming the call."""

    def __init__(self, sampler: PromptGroupSampler, target: str) -> None:
        self.inner = sampler
        self.target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _call(self, method: str, call: Callable[[], Any], **arguments: Any) -> Any:
        try:
            return call()
        except Exception as exc:
            raise self._error(method, arguments, f"raised {type(exc).__name__}: {exc}") from exc

    async def _call_async(self, method: str, call: Callable[[], Awaitable[Any]], **arguments: Any) -> Any:
        try:
            return await call()
        except Exception as exc:
            raise self._error(method, arguments, f"raised {type(exc).__name__}: {exc}") from exc

    def _error(self, method: str, arguments: dict[str, Any], what: str) -> CustomSamplerFailure:
        args = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        return CustomSamplerFailure(f"custom sampler {self.target} (async_rl.sampler.target): {method}({args}) {what}")

    def can_admit(self, trainer_version: int) -> bool:
        """The sampler's gate; must be a bool."""
        allowed = self._call(
            "can_admit", lambda: self.inner.can_admit(trainer_version), trainer_version=trainer_version
        )
        if not isinstance(allowed, bool):
            raise self._error("can_admit", {"trainer_version": trainer_version}, f"returned {allowed!r}, not a bool")
        return allowed

    def admit(self) -> int | None:
        """The sampler's admit; must return a target step (int) or None."""
        target = self._call("admit", self.inner.admit)
        if target is not None and (not isinstance(target, int) or isinstance(target, bool)):
            raise self._error("admit", {}, f"returned {target!r}, not a target step (int) or None")
        return target

    async def select(self, *, trainer_version: int, min_groups: int, max_groups: int) -> list[GroupMeta] | None:
        """The sampler's select; must return None or ``min_groups``..``max_groups`` groups."""
        arguments = {"trainer_version": trainer_version, "min_groups": min_groups, "max_groups": max_groups}
        chosen = await self._call_async("select", lambda: self.inner.select(**arguments), **arguments)
        if chosen is None:
            return None
        if not isinstance(chosen, list) or not all(isinstance(group, GroupMeta) for group in chosen):
            raise self._error("select", arguments, f"returned {type(chosen).__name__}, not a list of GroupMeta")
        if not min_groups <= len(chosen) <= max_groups:
            raise self._error("select", arguments, f"returned {len(chosen)} groups")
        return chosen

    async def evict(self, *, trainer_version: int) -> list[GroupMeta]:
        """The sampler's evict; must return a list of GroupMeta."""
        evicted = await self._call_async(
            "evict", lambda: self.inner.evict(trainer_version=trainer_version), trainer_version=trainer_version
        )
        if not isinstance(evicted, list) or not all(isinstance(group, GroupMeta) for group in evicted):
            raise self._error(
                "evict", {"trainer_version": trainer_version}, f"returned {evicted!r}, not a list of GroupMeta"
            )
        return evicted

    def should_abort_inflight(self, *, start_weight: int, trainer_version: int) -> bool:
        """The sampler's abort rule."""
        return bool(
            self._call(
                "should_abort_inflight",
                lambda: self.inner.should_abort_inflight(start_weight=start_weight, trainer_version=trainer_version),
                start_weight=start_weight,
                trainer_version=trainer_version,
            )
        )
