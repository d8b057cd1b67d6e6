"""The recovery ledger: granularity resolution, token capture (sealed siblings kept), persistence across a restart."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
import torch

from sc_lightning.config.runtime import RolloutRecoveryConfig, TokenCaptureConfig
from sc_lightning.controller.buffer import TQReplayBuffer
from sc_lightning.controller.build import rollout_settings
from sc_lightning.controller.recovery import PendingGroup, RecoveryPolicy
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.engines.base import EngineError
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.rollout.manager import RolloutManager, ServedPolicy
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.types import Generation, Prompt
from tests.helpers.controllers import config, make
from tests.helpers.scripts import TOKENIZER, answer_correctly

POLICY = RecoveryPolicy(
    RolloutRecoveryConfig(
        default_granularity="sibling",
        task_source_granularity_overrides={"math": "prompt_group", "code": "sibling"},
        agent_granularity_overrides={"solver": "sibling", "judge": "prompt_group"},
    ),
    token_capture=True,
)


def prompt(**extra) -> Prompt:
    return Prompt("p", tuple(TOKENIZER.encode("1+2=")), text="1+2=", answer="3", extra=extra, index=0)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, "sibling"),  # the default
        ({"task_source": "math"}, "prompt_group"),  # the task-source override
        ({"task_source": "math", "agent_ref": {"name": "solver"}}, "sibling"),  # the agent override wins
        ({"task_source": "code", "agent_ref": {"name": "judge"}}, "prompt_group"),
        ({"extra_env_info": {"task_source": "math", "agent_ref": "other"}}, "prompt_group"),  # nested, unknown agent
    ],
)
def test_agent_wins_over_task_source_then_the_default(extra: dict, expected: str) -> None:
    assert POLICY.granularity_for(prompt(**extra)) == expected
    entry = POLICY.pending(prompt(**extra), 3)
    assert (entry.granularity, entry.sealed) == (expected, {} if expected == "sibling" else None)


def test_a_non_string_identity_is_named() -> None:
    with pytest.raises(TypeError, match="prompt p: its task_source must be a string, got int"):
        POLICY.granularity_for(prompt(task_source=3))


def test_without_token_capture_nothing_is_sealed() -> None:
    assert RecoveryPolicy(RolloutRecoveryConfig(), token_capture=False).pending(prompt(), 0).sealed is None


def test_entries_round_trip_and_keep_their_resolved_granularity() -> None:
    sealed = {1: Generation((5, 6, 7), (-0.1, -0.2, -0.3), "stop", 4, (4, 4, 5))}  # a refit landed mid-request
    entry = PendingGroup(prompt(task_source="math"), 7, "sibling", sealed, {})
    saved = json.loads(json.dumps(entry.to_dict()))
    assert PendingGroup.from_dict(saved, capture=True) == entry
    assert PendingGroup.from_dict(saved, capture=True).sealed[1].token_versions == (4, 4, 5)
    del saved["sealed"][0]["token_versions"]  # a ledger written before per-token versions: the start version
    assert PendingGroup.from_dict(saved, capture=True).sealed[1].token_versions == (4, 4, 4)
    conversation = Generation((5, 6, 7), (-0.1, 0.0, -0.3), "stop", 4, (), (True, False, True))  # a tool's token
    multiturn = PendingGroup(prompt(), 7, "sibling", {0: conversation}, {})
    assert PendingGroup.from_dict(json.loads(json.dumps(multiturn.to_dict())), capture=True) == multiturn
    capture_off = PendingGroup.from_dict(saved, capture=False)  # capture off now: regenerate everything
    assert (capture_off.sealed, capture_off.conversations) == (None, None)
    # a config that now says prompt_group for "math" does not reinterpret the saved entry
    assert PendingGroup.from_dict(saved, capture=True).granularity == "sibling"
    restored_group = PendingGroup.from_dict({**saved, "granularity": "prompt_group"}, capture=True)
    assert restored_group.sealed is None and restored_group.conversations is None  # prompt_group regenerates all


def manager(engine: ScriptedEngine) -> tuple[RolloutManager, TQReplayBuffer]:
    buffer = TQReplayBuffer(MemoryDataPlane())
    settings = rollout_settings(config({"name": "in_order", "max_lookahead_versions": 0}))
    settings = type(settings)(**{**settings.__dict__, "generations_per_prompt": 4})
    served = ServedPolicy(engine, version=5)
    return RolloutManager(served, ArithmeticEnvironment(), TOKENIZER, buffer, settings), buffer


def test_sealed_generations_are_reused_and_new_ones_sealed_as_they_finish() -> None:
    engine = ScriptedEngine(answer_correctly)
    rollouts, buffer = manager(engine)
    old = Generation(tuple(TOKENIZER.encode("9")), (-0.3,), "stop", 2)  # a wrong answer from weights 2
    sealed = {0: old, 2: old}
    meta = asyncio.run(rollouts.generate_and_push(prompt(), sealed=sealed))
    assert engine.calls == 2  # only the two missing siblings were generated
    assert sorted(sealed) == [0, 1, 2, 3]  # and sealed the moment they finished
    assert meta.start_weight == 2  # the group is as old as its oldest generation
    rows = buffer.data_plane.get(list(meta.keys), ["input_ids", "total_reward"])
    completions = [TOKENIZER.decode(ids[4:].tolist()) for ids in rows["input_ids"]]
    assert completions == ["9", "3", "9", "3"]
    assert torch.stack(rows["total_reward"]).tolist() == [0.0, 1.0, 0.0, 1.0]


def test_a_failed_group_keeps_what_finished_before_the_failure() -> None:
    rollouts, _ = manager(ScriptedEngine(answer_correctly, fail_on=3))
    sealed: dict[int, Generation] = {}
    with pytest.raises(Exception, match="scripted failure on request 3") as failure:
        asyncio.run(rollouts.generate_and_push(prompt(), sealed=sealed))
    assert isinstance(failure.value.__cause__, EngineError)
    assert sorted(sealed) == [0, 1, 2]  # a retry or a restart reuses these


CAPTURED = dataclasses.replace(
    config({"name": "in_order", "max_lookahead_versions": 0}, n=1), token_capture=TokenCaptureConfig(enabled=True)
)  # one prompt x two generations per step, on-policy, token capture on


def test_a_restart_redispatches_only_the_unfinished_siblings() -> None:
    """A checkpoint state whose pending group has one of two generations sealed: one request, tokens kept."""

    async def scenario() -> None:
        source = make(CAPTURED, ScriptedEngine(answer_correctly), dataset_size=2)
        state = json.loads(json.dumps(source.checkpoint_state()))
        taken = next(source.prompts)  # the first prompt left the dataset, its group unfinished at the crash
        state["prompts"] = source.prompts.state_dict()
        sealed = {0: Generation(tuple(TOKENIZER.encode("8")), (-0.4,), "stop", 0)}
        state["pending"] = [PendingGroup(taken[0], 0, "sibling", sealed).to_dict()]
        await source.shutdown()

        engine = ScriptedEngine(answer_correctly)
        restarted = make(CAPTURED, engine, dataset_size=2)
        await restarted.restore(state, group_size=2)
        await restarted.start()
        first = await restarted.select(0, 1, 1, timeout_s=30)
        rows = restarted.data_plane.get(list(first[0].keys), ["input_ids"])
        assert first[0].prompt_id == taken[0].prompt_id
        assert TOKENIZER.decode(rows["input_ids"][0][len(taken[0].token_ids) :].tolist()) == "8"  # kept as sealed
        assert engine.calls == 1  # only the missing sibling (the next step waits for a refit: lookahead 0)
        await restarted.shutdown()

    asyncio.run(scenario())


def test_without_rows_a_captured_buffered_group_comes_back_whole_without_generating() -> None:
    """A checkpoint without data-plane rows lists the buffered group to redispatch, all siblings sealed."""

    async def scenario() -> None:
        source = make(CAPTURED, ScriptedEngine(answer_correctly), dataset_size=2)
        await source.start()
        await source.wait_until(lambda: len(source.buffer.ready_metas()) == 1, timeout_s=30)
        state = json.loads(json.dumps(await source.snapshot(None)))
        await source.shutdown()
        assert state["replay_index"]["groups"] == [] and not state["rows_indexed"]
        (entry,) = state["pending"]
        assert [g["index"] for g in entry["sealed"]] == [0, 1]

        engine = ScriptedEngine(answer_correctly)
        restarted = make(CAPTURED, engine, dataset_size=2)
        await restarted.restore(state, group_size=2)
        await restarted.start()
        (group,) = await restarted.select(0, 1, 1, timeout_s=30)
        assert group.prompt_id == entry["prompt"]["prompt_id"] and engine.calls == 0  # nothing generated again
        await restarted.shutdown()

    asyncio.run(scenario())
