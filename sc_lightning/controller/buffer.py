"""TQReplayBuffer: group-granular slots over the data plane, in dispatch order, with versions stamped on them.

A slot is appended when a prompt group is dispatched (``reserve``), so buffer order is dispatch order and
``start_weight`` never decreases down the buffer. ``commit`` writes the group's N training rows to the data plane
and flips the slot ready. Samplers read the slots and take groups out (``remove``); rows stay in the data plane
until the trainer clears them, or are cleared at once when a group is evicted. The buffer is driven from one
asyncio event loop: every mutation between awaits is synchronous, and commit re-finds its slot after its await.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sc_lightning.config.resume_rules import (
    REPLAY_INDEX_VERSION,
    check_buffer_capacity,
    check_replay_index,
    replay_digest,
)
from sc_lightning.controller.api import GroupMeta
from sc_lightning.controller.rows import group_to_columns
from sc_lightning.data_plane.base import DataPlane
from sc_lightning.types import ScoredGroup

log = logging.getLogger(__name__)


class BufferError(RuntimeError):
    """A buffer operation named a group that is not in the buffer, or a replay index that does not fit."""


@dataclass
class Slot:
    """One dispatched prompt group: reserved at dispatch, ready once committed."""

    group_id: str
    prompt_id: str
    start_weight: int
    target_step: int | None
    meta: GroupMeta | None = None

    @property
    def ready(self) -> bool:
        """Whether the group's rows are committed to the data plane."""
        return self.meta is not None


class TQReplayBuffer:
    """Group slots in dispatch order over a data plane: reserve, commit, remove, promote, replay index."""

    def __init__(self, data_plane: DataPlane) -> None:
        self.data_plane = data_plane
        self.slots: list[Slot] = []
        self._evicted_keys: list[str] = []  # rows of evicted groups, deleted by the next delete_rows()
        self._commits_open = asyncio.Event()
        self._commits_open.set()
        self._committing = 0
        self._no_commits = asyncio.Event()
        self._no_commits.set()

    @contextlib.asynccontextmanager
    async def commits_paused(self) -> AsyncIterator[None]:
        """A checkpoint barrier: commits in progress finish, new ones wait until the block ends.

        Inside it the data plane's rows and the replay index describe exactly the same committed groups, while
        generation goes on (finished groups queue at the barrier instead of committing).
        """
        if not self._commits_open.is_set():
            raise BufferError("commits are already paused (checkpoint barriers do not nest)")
        self._commits_open.clear()
        try:
            await self._no_commits.wait()
            yield
        finally:
            self._commits_open.set()

    def __len__(self) -> int:
        return len(self.slots)

    def reserve(self, *, prompt_id: str, weight_version: int, target_step: int | None) -> str:
        """Append an unready slot stamped with the dispatching weight version; returns its new group id."""
        group_id = uuid.uuid4().hex
        self.slots.append(Slot(group_id, prompt_id, weight_version, target_step))
        return group_id

    def index_of(self, group_id: str) -> int:
        """Position of a group's slot; BufferError when it is not in the buffer."""
        for index, slot in enumerate(self.slots):
            if slot.group_id == group_id:
                return index
        raise BufferError(f"group {group_id} is not in the replay buffer (removed, evicted or never reserved)")

    async def commit(self, group_id: str, group: ScoredGroup, *, start_weight: int, end_weight: int) -> GroupMeta:
        """Write the group's rows to the data plane and flip its slot ready; rows are rolled back on failure."""
        await self._commits_open.wait()  # a checkpoint is being taken: wait for it, then commit
        self._committing += 1
        self._no_commits.clear()
        try:
            return await self._commit(group_id, group, start_weight=start_weight, end_weight=end_weight)
        finally:  # no await from here to the caller: the controller marks the prompt committed in the same tick
            self._committing -= 1
            if self._committing == 0:
                self._no_commits.set()

    async def _commit(self, group_id: str, group: ScoredGroup, *, start_weight: int, end_weight: int) -> GroupMeta:
        slot = self.slots[self.index_of(group_id)]
        if slot.ready:
            raise BufferError(f"group {group_id} (prompt {slot.prompt_id}) is already committed")
        keys, columns, tags = group_to_columns(group_id, group, start_weight=start_weight, end_weight=end_weight)
        tags = [{**tag, "target_step": slot.target_step} for tag in tags]
        try:
            await asyncio.to_thread(self.data_plane.put, keys, columns, tags)
            slot = self.slots[self.index_of(group_id)]  # the list may have shifted during the await
        except BaseException:
            await _clear_quietly(self.data_plane, keys)
            raise
        slot.meta = GroupMeta(
            group_id=group_id,
            prompt_id=slot.prompt_id,
            keys=tuple(keys),
            sequence_lengths=tuple(int(row.numel()) for row in columns["input_ids"]),
            start_weight=start_weight,
            end_weight=end_weight,
            target_step=slot.target_step,
            reward_mean=sum(group.rewards) / len(group.rewards),
            completion_length_mean=sum(len(g.token_ids) for g in group.generations) / len(group.generations),
        )
        return slot.meta

    def take(self, indices: Iterable[int]) -> list[GroupMeta]:
        """Remove ready slots at ``indices`` (their rows stay in the data plane) and return their metadata."""
        order = list(dict.fromkeys(indices))  # the caller's preference order, without repeats
        self._checked(order)
        metas = [self.slots[i].meta for i in order]
        if any(meta is None for meta in metas):
            raise BufferError("only committed groups can be taken for training")
        self._delete(sorted(order))
        return [meta for meta in metas if meta is not None]

    async def evict(self, indices: Iterable[int]) -> list[GroupMeta]:
        """Remove ready slots at ``indices``; their rows go at the next :meth:`delete_rows`.

        Rows are deleted only there (the controller calls it when a step publishes its weights, under its claims
        lock), so a snapshot being written never loses a row its replay index names.
        """
        metas = self.take(indices)
        self._evicted_keys += [key for meta in metas for key in meta.keys]
        return metas

    async def delete_rows(self, groups: Sequence[GroupMeta] = ()) -> None:
        """Delete the rows of ``groups`` (trained) and of every group evicted since the last call."""
        keys = self._evicted_keys + [key for group in groups for key in group.keys]
        self._evicted_keys = []
        if keys:
            await asyncio.to_thread(self.data_plane.clear, keys)

    def remove_group(self, group_id: str) -> Slot:
        """Drop a slot by group id (a failed or cancelled rollout); its rows, if any, are the caller's to clear."""
        index = self.index_of(group_id)
        return self.slots.pop(index)

    def discard_if_present(self, group_id: str) -> Slot | None:
        """Drop a slot if it is still here (cleanup paths that may race a removal); returns it or None."""
        try:
            return self.remove_group(group_id)
        except BufferError:
            return None

    def count_for_target_step(self, target_step: int) -> int:
        """Slots (reserved or ready) stamped for ``target_step``."""
        return sum(1 for slot in self.slots if slot.target_step == target_step)

    def promote_ready_group(self, *, to_target_step: int) -> tuple[str, int] | None:
        """Re-stamp the ready group with the furthest later target into ``to_target_step``.

        Returns the group id and its old target step, or None when no ready group has a later target.
        """
        later = [s for s in self.slots if s.ready and s.target_step is not None and s.target_step > to_target_step]
        if not later:
            return None
        lender = max(later, key=lambda slot: slot.target_step or 0)  # the first of equals wins
        old = lender.target_step
        lender.target_step = to_target_step
        lender.meta = dataclasses.replace(lender.meta, target_step=to_target_step) if lender.meta else None
        return lender.group_id, old

    def ready_metas(self) -> list[GroupMeta]:
        """Metadata of every committed group still in the buffer, in buffer order."""
        return [slot.meta for slot in self.slots if slot.meta is not None]

    def state_dict(self, claimed: Sequence[GroupMeta] = ()) -> dict[str, Any]:
        """Metadata-only replay index of the committed groups, with a digest binding it to their rows.

        ``claimed`` groups (taken by the step being trained, rows still in the data plane) come first.
        """
        return replay_index([*claimed, *self.ready_metas()])

    def load_state_dict(self, state: dict[str, Any], *, max_groups: int, expected_group_size: int) -> int:
        """Restore committed groups from a replay index (their rows must already be in the data plane).

        ResumeMismatch when the index does not fit (its digest, group size, or more than ``max_groups`` groups).
        """
        groups = check_replay_index(state, group_size=expected_group_size)
        check_buffer_capacity(buffered=len(groups), dispatched=0, capacity=max_groups)
        known = {slot.group_id for slot in self.slots}
        for group in groups:
            if group["group_id"] in known:
                raise BufferError(f"replay index group {group['group_id']} is already in the buffer")
        for group in groups:
            meta = GroupMeta(
                **{**group, "keys": tuple(group["keys"]), "sequence_lengths": tuple(group["sequence_lengths"])}
            )
            self.slots.append(Slot(meta.group_id, meta.prompt_id, meta.start_weight, meta.target_step, meta))
        return len(groups)

    def _checked(self, indices: Iterable[int]) -> list[int]:
        chosen = sorted(set(indices))
        for index in chosen:
            if not 0 <= index < len(self.slots):
                raise BufferError(f"buffer index {index} out of range; size={len(self.slots)}")
        return chosen

    def _delete(self, sorted_indices: Sequence[int]) -> None:
        for index in reversed(sorted_indices):
            del self.slots[index]


def replay_index(metas: Sequence[GroupMeta]) -> dict[str, Any]:
    """A metadata-only replay index of ``metas``, in order, with the digest that binds it to their rows."""
    groups = [asdict(meta) for meta in metas]
    return {"version": REPLAY_INDEX_VERSION, "groups": groups, "digest": replay_digest(groups)}


async def _clear_quietly(data_plane: DataPlane, keys: Sequence[str]) -> None:
    try:
        await asyncio.shield(asyncio.to_thread(data_plane.clear, keys))
    except Exception as exc:  # the commit's own failure is what the caller must see; the rows are unreferenced
        log.warning("could not roll back rows %s after a failed commit: %s", list(keys)[:3], exc)
