"""RolloutSnapshotter against a real controller (FAKE scripted engine): anchors, mid-step claims, failures."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sc_lightning.checkpoint.atomic import verify_bundle, write_atomically
from sc_lightning.checkpoint.bundle import DATA_PLANE_DIR, read_controller_state
from sc_lightning.checkpoint.periodic import RolloutSnapshotter, SnapshotFailures
from sc_lightning.checkpoint.snapshots import BOOTSTRAP_DIR, snapshot_dirs
from sc_lightning.controller.api import RolloutPumpError
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.controllers import config, make
from tests.helpers.scripts import answer_correctly

IDENTITY = {"grpo": {"seed": 7}}


def snapshotter(root: Path, **changes) -> RolloutSnapshotter:
    settings = {"interval_s": 0.01, "keep_latest_k": 2, "max_consecutive_failures": 2, "identity": IDENTITY}
    return RolloutSnapshotter(checkpoint_dir=root, **{**settings, **changes})


def test_snapshots_follow_the_durable_anchor_and_hold_the_step_in_progress(tmp_path) -> None:
    async def scenario() -> None:
        controller = make(config({"name": "in_order", "max_lookahead_versions": 1}), ScriptedEngine(answer_correctly))
        await controller.start()
        writer = snapshotter(tmp_path)
        claimed = await controller.select(0, 1, 1, timeout_s=30)  # step 0 is being trained: one group claimed
        first = await writer.attempt(controller)
        assert first.parent.parent == tmp_path / BOOTSTRAP_DIR  # before any trainer bundle: the bootstrap anchor
        verify_bundle(first)
        state = read_controller_state(first)
        assert state["claimed"] == 1 and state["replay_index"]["groups"][0]["group_id"] == claimed[0].group_id
        saved = MemoryDataPlane()
        saved.load(first / DATA_PLANE_DIR)
        assert set(claimed[0].keys) <= set(saved.keys())  # the claimed group's rows are in the snapshot

        await controller.begin_refit(1)  # step 0 trained: the claim is released, its rows deleted
        await controller.finish_refit(1)
        assert await writer.attempt(controller) is None and writer.skipped == 1  # step_1 is not durable yet
        with write_atomically(tmp_path / "step_1") as directory:
            (directory / "trainer.ckpt").write_bytes(b"weights")
        second = await writer.attempt(controller)
        assert second.parent.parent == tmp_path / "step_1"
        assert read_controller_state(second)["claimed"] == 0
        assert not (tmp_path / BOOTSTRAP_DIR).exists()  # a trainer bundle exists: the bootstrap lineage is retired
        for _ in range(3):
            await writer.attempt(controller)
        assert [n for n, _ in snapshot_dirs(tmp_path / "step_1")] == [3, 4]  # keep_latest_k
        await controller.shutdown()

    asyncio.run(scenario())


def test_failures_in_a_row_stop_the_run_with_the_last_error(tmp_path) -> None:
    """The checkpoint dir is a file: every attempt fails; the controller's next call names the snapshots."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")

    async def scenario() -> None:
        engine = ScriptedEngine(gated=True)  # nothing ever commits: select waits until the failure wakes it
        controller = make(config({"name": "in_order", "max_lookahead_versions": 0}), engine)
        writer = snapshotter(blocked)
        controller.add_background_task("rollout snapshots", writer.run)
        await controller.start()
        with pytest.raises(
            RolloutPumpError, match=r"^rollout snapshots failed: rollout snapshots failed 2 times"
        ) as err:
            await controller.select(0, 2, 2, timeout_s=30)
        assert isinstance(err.value.__cause__, SnapshotFailures) and writer.written == []
        await controller.shutdown()

    asyncio.run(scenario())
