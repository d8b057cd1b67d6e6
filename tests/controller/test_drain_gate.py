"""The drain gate (``async_rl.in_flight_weight_updates: false``) end to end through the SingleController, with the
real buffer, samplers, data plane and environment.

The engine is the FAKE ScriptedEngine, gated: a test decides when each prompt's generations finish, so it can put
groups in flight at a refit and keep them there (a hung generation).
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sc_lightning.controller.api import DrainTimeout, GroupMeta
from sc_lightning.controller.controller import SingleController
from sc_lightning.rollout.datasets import ArithmeticDataset
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.controllers import config, make
from tests.helpers.scripts import TOKENIZER, answer_correctly

N = 2  # groups per step
# no generation deadline: the drain's deadline is then the only one a hung generation meets
FAILURE = {"max_infra_attempts_per_prompt": 1, "max_data_attempts_per_prompt": 1, "generation_timeout_s": None}


def drain_gate(timeout_s: float = 30) -> dict:
    """The async_rl knobs that turn the drain gate on."""
    return {"in_flight_weight_updates": False, "drain_timeout_s": timeout_s}


def prompt_tokens(dataset_size: int) -> dict[str, tuple[int, ...]]:
    """make()'s prompts by id: the ScriptedEngine gates requests by prompt tokens."""
    return {prompt.prompt_id: prompt.token_ids for prompt in ArithmeticDataset(dataset_size, 0, TOKENIZER)}


def release_unfinished_when_draining(controller: SingleController, engine: ScriptedEngine, size: int) -> list[int]:
    """Once a refit waits in the drain, let every group still generating finish; returns how many there were, per
    drain. Were the gate not to wait, the groups would stay parked until the test releases them after the refit."""
    tokens, drain, counts = prompt_tokens(size), controller.admission.gate.drain, []

    async def release_then_drain(timeout_s: float) -> None:
        unfinished = [slot for slot in controller.buffer.slots if not slot.ready]
        counts.append(len(unfinished))
        for slot in unfinished:
            engine.release(tokens[slot.prompt_id])
        await drain(timeout_s)

    controller.admission.gate.drain = release_then_drain
    return counts


@settings(max_examples=20, deadline=None)
@given(lookahead=st.integers(1, 2), early=st.lists(st.booleans(), min_size=8, max_size=8))
def test_the_drain_gate_trains_no_group_spanning_a_refit(lookahead: int, early: list[bool]) -> None:
    """in_order dispatches up to ``lookahead`` batches ahead, so every refit lands while groups of later steps are
    generating; ``early[i]`` says whether the i-th dispatched group finishes before its batch's step comes (any mix).
    The gate holds each refit until the rest finish: every committed group starts and ends on one version."""
    assume(not all(early[N : 2 * N]))  # batch 1 (dispatched at weight 0) has a group in flight at the first refit
    size, steps = 8, 3
    tokens = prompt_tokens(size)

    async def scenario() -> tuple[list[GroupMeta], list[int]]:
        engine = ScriptedEngine(answer_correctly, gated=True)
        sampler = {"name": "in_order", "max_lookahead_versions": lookahead}
        cfg = config(sampler, n=N, buffered=N * (lookahead + 1), failure=FAILURE, runtime=drain_gate())
        controller = make(cfg, engine, dataset_size=size)
        drained = release_unfinished_when_draining(controller, engine, size)
        order: dict[str, int] = {}  # group id -> dispatch order
        await controller.start()
        committed: list[GroupMeta] = []
        for version in range(steps):
            await engine.wait_for_requests(2 * N * min(version + lookahead + 1, size // N), timeout_s=30)
            for slot in controller.buffer.slots:
                index = order.setdefault(slot.group_id, len(order))
                if slot.target_step == version or early[index % len(early)]:
                    engine.release(tokens[slot.prompt_id])
            committed += await controller.select(version, N, N, timeout_s=30)
            await controller.begin_refit(version + 1)
            await controller.push_weights([], version + 1)
            await controller.finish_refit(version + 1)
        engine.release_all()
        await controller.wait_until(lambda: controller.admission.gate.generating == 0, timeout_s=30)
        committed += controller.buffer.ready_metas()
        await controller.shutdown()
        return committed, drained

    committed, drained = asyncio.run(scenario())
    assert len(committed) == size
    assert [(g.prompt_id, g.start_weight) for g in committed if g.start_weight != g.end_weight] == []
    assert drained[0] > 0, "the first refit must find groups in flight"


def test_a_hung_generation_stops_the_refit_at_the_drain_deadline_naming_step_prompts_groups_and_engine() -> None:
    tokens = prompt_tokens(8)

    async def scenario() -> tuple[str, dict[str, str]]:
        engine = ScriptedEngine(answer_correctly, gated=True)
        sampler = {"name": "in_order", "max_lookahead_versions": 1}
        cfg = config(sampler, buffered=4, failure=FAILURE, runtime=drain_gate(timeout_s=0.2))
        controller = make(cfg, engine)
        await controller.start()
        await engine.wait_for_requests(8, timeout_s=30)  # steps 0 and 1: 4 groups x 2 generations
        for slot in controller.buffer.slots:
            if slot.target_step == 0:
                engine.release(tokens[slot.prompt_id])
        await controller.select(0, 2, 2, timeout_s=30)
        hung = {slot.group_id: slot.prompt_id for slot in controller.buffer.slots if not slot.ready}  # never released
        with pytest.raises(DrainTimeout) as caught:
            await controller.begin_refit(1)
        engine.release_all()
        await controller.shutdown()
        return str(caught.value), hung

    message, hung = asyncio.run(scenario())
    assert len(hung) == 2
    assert message.startswith(
        "step 0: the drain gate (async_rl.in_flight_weight_updates: false) waited past async_rl.drain_timeout_s=0.2 "
        "for 2 rollout(s) still generating on engine 'scripted': "
    )
    for group_id, prompt_id in hung.items():
        assert f"prompt {prompt_id} (group {group_id}, start_weight 0)" in message


def test_a_colocated_engine_drains_before_it_stands_down_and_dispatch_waits_for_the_refit() -> None:
    """Stood down, the engine would pause its requests across the refit; it drains first, then nothing dispatches
    until finish_refit, so the next batch starts on the new weights."""

    at_stand_down: list[int] = []  # rollouts still generating when the engine was asked to stand down

    class RecordingEngine(ScriptedEngine):
        """Records how many rollouts were still generating when it was asked to stand down."""

        async def stand_down(self) -> None:
            """Record, then stand down (a FAKE engine has nothing to release)."""
            at_stand_down.append(controller.admission.gate.generating)

    engine = RecordingEngine(answer_correctly, gated=True)
    sampler = {"name": "in_order", "max_lookahead_versions": 1}
    controller = make(config(sampler, buffered=4, failure=FAILURE, runtime=drain_gate()), engine)
    tokens = prompt_tokens(8)

    async def scenario() -> list[GroupMeta]:
        drained = release_unfinished_when_draining(controller, engine, 8)
        await controller.start()
        await engine.wait_for_requests(8, timeout_s=30)
        for slot in controller.buffer.slots:
            if slot.target_step == 0:
                engine.release(tokens[slot.prompt_id])
        await controller.select(0, 2, 2, timeout_s=30)
        await controller.stand_down_engine()  # the train step of step 0 would run now
        assert drained == [2] and controller.stats().dispatched == 4  # batch 1 finished; batch 2 waits
        await controller.begin_refit(1)
        await controller.push_weights([], 1)
        await controller.wake_engine()
        await controller.finish_refit(1)
        await engine.wait_for_requests(12, timeout_s=30)  # batch 2, dispatched once dispatch reopened
        engine.release_all()
        later = await controller.select(1, 2, 2, timeout_s=30) + await controller.select(2, 2, 2, timeout_s=30)
        await controller.shutdown()
        return later

    later = asyncio.run(scenario())
    assert at_stand_down == [0]
    assert [(g.target_step, g.start_weight, g.end_weight) for g in later] == [(1, 0, 0)] * 2 + [(2, 1, 1)] * 2
