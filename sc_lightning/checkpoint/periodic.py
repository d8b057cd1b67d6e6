"""RolloutSnapshotter: every ``snapshot_attempt_interval_s``, try to write a rollout snapshot from the controller.

It runs as a background task on the controller's event loop (``controller.add_background_task``). An attempt,
behind the controller's checkpoint barrier (no refit, no commit, no row deletion meanwhile): find the durable
anchor of the trainer's weight version — skip if there is none yet — then save the data plane's rows and the
controller state into a new ``snapshot_NNNNNN``. The barrier is released before the snapshot is hashed, fsynced
and renamed (off the event loop), then retention keeps ``keep_latest_k``. ``max_consecutive_failures`` failed
attempts in a row stop the run with the last error; a skipped attempt is not a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sc_lightning.checkpoint.atomic import AtomicDirectory
from sc_lightning.checkpoint.bundle import DATA_PLANE_DIR, write_controller_files
from sc_lightning.checkpoint.snapshots import anchor_for, next_snapshot_dir, prune_snapshots
from sc_lightning.data_plane.base import DataPlane

log = logging.getLogger(__name__)


class SnapshotSource(Protocol):
    """What the snapshotter needs from the controller (the controller package is not imported here)."""

    trainer_version: int

    def checkpoint_barrier(self) -> AbstractAsyncContextManager[None]:
        """Hold trainer version, claims, committed groups and rows still."""

    def checkpoint_state(self) -> dict[str, Any]:
        """The controller's JSON-able checkpoint state."""

    @property
    def data_plane(self) -> DataPlane:
        """The data plane whose rows the snapshot saves."""


class SnapshotFailures(RuntimeError):
    """Rollout snapshots failed ``max_consecutive_failures`` times in a row; the message holds the last error."""


@dataclass
class RolloutSnapshotter:
    """Periodic rollout snapshots under ``checkpoint_dir`` (settings from ``rollout_checkpointing``)."""

    checkpoint_dir: Path
    interval_s: float
    keep_latest_k: int
    max_consecutive_failures: int
    identity: dict[str, Any]  # the config's compatibility identity, for a bootstrap anchor
    written: list[Path] = field(default_factory=list)
    skipped: int = 0

    async def run(self, source: SnapshotSource) -> None:
        """Attempt a snapshot every ``interval_s`` until cancelled; raise after too many failures in a row."""
        failures = 0
        async for _ in self._ticks():
            try:
                await self.attempt(source)
                failures = 0
            except Exception as exc:
                failures += 1
                log.warning("rollout snapshot attempt failed (%d in a row): %s", failures, exc)
                if failures >= self.max_consecutive_failures:
                    raise SnapshotFailures(
                        f"rollout snapshots failed {failures} times in a row "
                        f"(rollout_checkpointing.max_consecutive_failures={self.max_consecutive_failures}); "
                        f"last error: {type(exc).__name__}: {exc}"
                    ) from exc

    async def _ticks(self) -> AsyncIterator[None]:
        while True:
            await asyncio.sleep(self.interval_s)  # the cadence itself (a timer, not a synchronisation)
            yield

    async def attempt(self, source: SnapshotSource) -> Path | None:
        """One attempt: the new snapshot's path, or None when the trainer's version has no durable anchor yet."""
        async with source.checkpoint_barrier():
            version = source.trainer_version
            anchor = await asyncio.to_thread(anchor_for, self.checkpoint_dir, version, self.identity)
            if anchor is None:
                self.skipped += 1
                return None
            staged = await asyncio.to_thread(AtomicDirectory, next_snapshot_dir(anchor))
            try:
                await asyncio.to_thread(source.data_plane.save, staged.path / DATA_PLANE_DIR)
                write_controller_files(staged.path, source.checkpoint_state())
            except BaseException:
                staged.abort()
                raise
        snapshot = await asyncio.to_thread(staged.commit)  # hashing and fsync outside the barrier
        await asyncio.to_thread(prune_snapshots, self.checkpoint_dir, anchor, self.keep_latest_k)
        self.written.append(snapshot)
        log.info("rollout snapshot %s (trainer version %d)", snapshot, version)
        return snapshot
