"""Builders for controller tests: scored groups, a buffer over the in-process data plane, committed slots."""

from __future__ import annotations

import asyncio

from sc_lightning.controller.buffer import TQReplayBuffer
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.types import Generation, Prompt, ScoredGroup

GROUP_SIZE = 2


def scored(prompt_id: str, rewards: tuple[float, ...] = (1.0, 0.0)) -> ScoredGroup:
    """A scored group of ``len(rewards)`` two-token completions of a three-token prompt."""
    prompt = Prompt(prompt_id=prompt_id, token_ids=(2, 5, 7), text="x", answer="1", task="t")
    generations = tuple(Generation((4, 1), (-0.1, -0.2), "stop", 0) for _ in rewards)
    return ScoredGroup(prompt, generations, rewards)


def new_buffer() -> TQReplayBuffer:
    """An empty buffer over a fresh in-process data plane."""
    return TQReplayBuffer(MemoryDataPlane())


def add(buffer: TQReplayBuffer, name: str, *, start: int, target: int | None = None, ready: bool = True) -> str:
    """Reserve a slot for prompt ``name`` (and commit it unless ``ready`` is false); returns its group id."""
    group_id = buffer.reserve(prompt_id=name, weight_version=start, target_step=target)
    if ready:
        asyncio.run(buffer.commit(group_id, scored(name), start_weight=start, end_weight=start))
    return group_id


def names(groups) -> list[str]:
    """Prompt ids of selected/evicted groups, in order."""
    return [group.prompt_id for group in groups or []]
