"""The controller's checkpoint state: a resume from any between-steps moment trains every prompt exactly once.

The engine is the FAKE ScriptedEngine (timing varies from run to run, which is the point: every interleaving must
keep the property); the data plane (its own snapshot), buffer, samplers and prompt stream are real.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sc_lightning.config.resume_rules import ResumeMismatch
from sc_lightning.controller.controller import SingleController
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.controllers import config, make, train_steps
from tests.helpers.scripts import answer_correctly

PROMPTS = 12  # 6 steps of 2 groups, one epoch


def build(lookahead: int, data_plane: MemoryDataPlane) -> SingleController:
    cfg = config({"name": "in_order", "max_lookahead_versions": lookahead}, buffered=2 * (lookahead + 1))
    controller = make(cfg, ScriptedEngine(answer_correctly), dataset_size=PROMPTS)
    controller.buffer.data_plane = data_plane  # the test owns the data plane, to snapshot and reload it
    return controller


async def train_until_exhausted(controller: SingleController, first_version: int) -> list[list]:
    """Train steps from ``first_version`` until the dataset is exhausted and the buffer drained."""
    trained, version = [], first_version
    while (chunk := await controller.select(version, 2, 2, timeout_s=30)) is not None:
        trained.append(chunk)
        version += 1
        await controller.begin_refit(version)
        await controller.finish_refit(version)
    return trained


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lookahead=st.integers(0, 2), steps_before=st.integers(0, 5), mid_step=st.booleans(), rows=st.booleans())
def test_a_resume_trains_every_prompt_exactly_once(
    tmp_path_factory, lookahead: int, steps_before: int, mid_step: bool, rows: bool
) -> None:
    """Snapshot between steps, or in the middle of one (a group claimed, the step unfinished), then resume.

    With ``rows`` the data plane is saved and indexed; without, the claimed and buffered groups are regenerated.
    """
    snapshot = tmp_path_factory.mktemp("snapshot")

    async def first_run() -> tuple[list, dict]:
        controller = build(lookahead, MemoryDataPlane())
        await controller.start()
        trained = await train_steps(controller, steps_before, n=2, min_groups=2)
        claimed = await controller.select(steps_before, 1, 1, timeout_s=30) if mid_step else []
        saved = await controller.snapshot(snapshot if rows else None)
        state = json.loads(json.dumps(saved))  # it must survive JSON
        assert state["claimed"] == len(claimed) and state["rows_indexed"] == rows
        listed = state["replay_index"]["groups"] if rows else state["pending"]
        ids = [g["prompt_id"] if rows else g["prompt"]["prompt_id"] for g in listed]
        # the claimed group comes first: indexed (its rows in the snapshot) or listed to regenerate
        assert ids[: len(claimed)] == [g.prompt_id for g in claimed]
        assert rows or state["replay_index"]["groups"] == []
        await controller.shutdown()
        return trained, state

    async def second_run(state: dict) -> list:
        data_plane = MemoryDataPlane()
        if rows:
            data_plane.load(snapshot)
        controller = build(lookahead, data_plane)
        await controller.restore(state, group_size=2)
        await controller.start()
        trained = await train_until_exhausted(controller, state["trainer_version"])
        assert data_plane.keys() == []
        await controller.shutdown()
        return trained

    before, state = asyncio.run(first_run())
    after = asyncio.run(second_run(state))
    steps = before + after
    prompts = Counter(group.prompt_id for step in steps for group in step)
    assert sorted(prompts) == sorted(f"arithmetic-{i:06d}" for i in range(PROMPTS))
    assert set(prompts.values()) == {1}, "every prompt trained exactly once across the crash"
    # in_order keeps its contract across the resume: step k trains exactly the groups stamped for step k
    assert [[g.target_step for g in step] for step in steps] == [[k, k] for k in range(len(steps))]


def test_pending_prompts_are_those_taken_but_not_committed() -> None:
    """Gated: two steps' prompts are in flight at weight 0; the state lists all four as pending, targets kept."""

    async def scenario() -> dict:
        engine = ScriptedEngine(answer_correctly, gated=True)
        cfg = config({"name": "in_order", "max_lookahead_versions": 1}, buffered=4)
        controller = make(cfg, engine, dataset_size=PROMPTS)
        await controller.start()
        await engine.wait_for_requests(8, timeout_s=30)
        state = controller.checkpoint_state()
        await controller.shutdown()
        return state

    state = asyncio.run(scenario())
    assert [p["target_step"] for p in state["pending"]] == [0, 0, 1, 1]  # in dispatch order
    assert len({p["prompt"]["prompt_id"] for p in state["pending"]}) == 4
    assert state["replay_index"]["groups"] == [] and state["dispatch_index"] == 1
    assert state["prompts"]["position"] == 2  # two batches of two taken from the stream


def test_restore_refuses_a_state_that_does_not_fit() -> None:
    async def scenario() -> None:
        source = build(1, MemoryDataPlane())
        state = source.checkpoint_state()
        small = build(0, MemoryDataPlane())
        with pytest.raises(ResumeMismatch, match="controller state was written in format version 99"):
            await small.restore({**state, "version": 99}, group_size=2)
        state["pending"] = [{"prompt": {"prompt_id": f"p{i}", "token_ids": [2]}, "target_step": 0} for i in range(3)]
        state["pending_holding_permits"] = 3
        with pytest.raises(ResumeMismatch, match=r"rollouts is 2 but .* 0 buffered and 3 dispatched .*>= 3"):
            await small.restore(state, group_size=2)
        await small.start()
        with pytest.raises(RuntimeError, match="before start"):
            await small.restore(state, group_size=2)
        await small.shutdown()
        await source.shutdown()

    asyncio.run(scenario())


def test_a_windowed_pump_waiting_for_permits_resumes_with_the_same_capacity() -> None:
    """Windowed dispatch is ungated: with room for one step, the pump holds batch 0 in flight and has taken batch 1,
    which waits for permits. Those prompts hold none, so the same capacity resumes and trains each prompt once."""
    cfg = config({"name": "windowed", "max_staleness_versions": 1}, buffered=2)

    async def first_run() -> dict:
        engine = ScriptedEngine(answer_correctly, gated=True)
        controller = make(cfg, engine, dataset_size=PROMPTS)
        await controller.start()
        await engine.wait_for_requests(4, timeout_s=30)  # batch 0: 2 prompts x 2 generations
        await controller.wait_until(lambda: controller.prompts.position == 2, timeout_s=30)  # batch 1 taken
        state = controller.checkpoint_state()
        await controller.shutdown()
        return state

    async def second_run(state: dict) -> list:
        controller = make(cfg, ScriptedEngine(answer_correctly), dataset_size=PROMPTS)
        await controller.restore(state, group_size=2)
        await controller.start()
        trained = await train_until_exhausted(controller, state["trainer_version"])
        await controller.shutdown()
        return trained

    state = asyncio.run(first_run())
    assert (len(state["pending"]), state["pending_holding_permits"]) == (4, 2)
    prompts = Counter(group.prompt_id for step in asyncio.run(second_run(state)) for group in step)
    assert sorted(prompts) == sorted(f"arithmetic-{i:06d}" for i in range(PROMPTS)) and set(prompts.values()) == {1}
