"""TQReplayBuffer: dispatch order, commit to rows, strict errors, rollback, promotion, replay index."""

from __future__ import annotations

import asyncio

import pytest
import torch

from sc_lightning.config.resume_rules import ResumeMismatch
from sc_lightning.controller.api import ROW_FIELDS
from sc_lightning.controller.buffer import BufferError, TQReplayBuffer
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.types import Generation, ScoredGroup
from tests.controller.helpers import GROUP_SIZE, add, new_buffer, scored


def test_commit_writes_one_training_row_per_generation() -> None:
    buffer = new_buffer()
    group_id = buffer.reserve(prompt_id="p", weight_version=3, target_step=7)
    meta = asyncio.run(buffer.commit(group_id, scored("p", (1.0, 0.0)), start_weight=3, end_weight=4))
    assert meta.keys == (f"{group_id}/g0", f"{group_id}/g1")
    assert (meta.start_weight, meta.end_weight, meta.target_step, meta.sequence_lengths) == (3, 4, 7, (5, 5))
    rows = buffer.data_plane.get(list(meta.keys), list(ROW_FIELDS))
    assert rows["input_ids"][0].tolist() == [2, 5, 7, 4, 1]
    assert rows["token_mask"][0].tolist() == [0, 0, 0, 1, 1]
    assert rows["generation_logprobs"][0].tolist() == pytest.approx([0, 0, 0, -0.1, -0.2])
    assert rows["token_versions"][0].tolist() == [-1, -1, -1, 0, 0]  # the helper's generations: weights 0
    assert [r.item() for r in rows["total_reward"]] == [1.0, 0.0]
    assert [r.item() for r in rows["prompt_lengths"]] == [3, 3]
    tags = buffer.data_plane.tags(list(meta.keys))
    assert tags[1] == {
        "group_id": group_id,
        "prompt_id": "p",
        "prompt_index": None,  # the test prompt comes from no dataset
        "generation_index": 1,
        "weight_version": 3,
        "end_weight": 4,
        "target_step": 7,
    }


def test_environment_tokens_of_a_multiturn_completion_are_masked_out_of_the_loss() -> None:
    buffer = new_buffer()
    prompt = scored("p").prompt
    turns = Generation((4, 9, 9, 6), (-0.1, 0.0, 0.0, -0.3), "stop", 2, (2, 2, 2, 3), (True, False, False, True))
    group = ScoredGroup(prompt, (turns, turns), (1.0, 0.0))
    meta = asyncio.run(
        buffer.commit(
            buffer.reserve(prompt_id="p", weight_version=2, target_step=None), group, start_weight=2, end_weight=3
        )
    )
    rows = buffer.data_plane.get(list(meta.keys), list(ROW_FIELDS))
    assert rows["token_mask"][0].tolist() == [0, 0, 0, 1, 0, 0, 1]  # the model's turns only
    assert rows["token_versions"][0].tolist() == [-1, -1, -1, 2, 2, 2, 3]  # a refit between the turns


def test_slots_keep_dispatch_order_and_commit_refinds_its_slot() -> None:
    buffer = new_buffer()
    first = buffer.reserve(prompt_id="a", weight_version=0, target_step=None)
    second = buffer.reserve(prompt_id="b", weight_version=1, target_step=None)
    buffer.remove_group(first)  # the list shifts under the pending commit of the second group
    asyncio.run(buffer.commit(second, scored("b"), start_weight=1, end_weight=1))
    assert [s.prompt_id for s in buffer.slots] == ["b"] and buffer.slots[0].ready


def test_unknown_or_double_commit_is_an_error_without_side_effects() -> None:
    buffer = new_buffer()
    with pytest.raises(BufferError, match="group nope is not in the replay buffer"):
        asyncio.run(buffer.commit("nope", scored("x"), start_weight=0, end_weight=0))
    assert buffer.data_plane.keys() == []
    group_id = add(buffer, "p", start=0)
    with pytest.raises(BufferError, match="already committed"):
        asyncio.run(buffer.commit(group_id, scored("p"), start_weight=0, end_weight=0))


def test_failed_commit_rolls_back_its_rows_and_keeps_the_slot_unready() -> None:
    buffer = TQReplayBuffer(MemoryDataPlane(capacity=GROUP_SIZE))
    add(buffer, "fits", start=0)
    group_id = buffer.reserve(prompt_id="overflow", weight_version=0, target_step=None)
    with pytest.raises(Exception, match="capacity"):
        asyncio.run(buffer.commit(group_id, scored("overflow"), start_weight=0, end_weight=0))
    assert len(buffer.data_plane.keys()) == GROUP_SIZE  # only the first group's rows
    assert not buffer.slots[buffer.index_of(group_id)].ready


def test_rows_of_taken_and_evicted_groups_go_only_at_delete_rows() -> None:
    buffer = new_buffer()
    add(buffer, "trained", start=0)
    add(buffer, "stale", start=0)
    add(buffer, "kept", start=0)
    taken = buffer.take([0])
    evicted = asyncio.run(buffer.evict([0]))
    assert len(buffer) == 1
    assert buffer.data_plane.get(list(taken[0].keys), ["input_ids"])  # still readable by the trainer
    assert buffer.data_plane.get(list(evicted[0].keys), ["input_ids"])  # a snapshot in progress may still save them
    asyncio.run(buffer.delete_rows(taken))
    for group in (*taken, *evicted):
        with pytest.raises(KeyError):
            buffer.data_plane.get(list(group.keys), ["input_ids"])
    assert len(buffer.data_plane.keys()) == GROUP_SIZE  # the kept group's rows only
    buffer.take([0])
    with pytest.raises(BufferError, match="out of range"):
        buffer.take([3])
    add(buffer, "running", start=0, ready=False)
    with pytest.raises(BufferError, match="only committed groups"):
        buffer.take([0])


def test_promote_lends_the_furthest_ready_future_group() -> None:
    buffer = new_buffer()
    add(buffer, "t3", start=0, target=3)
    add(buffer, "t5-running", start=0, target=5, ready=False)
    add(buffer, "t4", start=0, target=4)
    add(buffer, "t4b", start=0, target=4)
    assert buffer.promote_ready_group(to_target_step=2) == (buffer.slots[2].group_id, 4)
    assert [(s.prompt_id, s.target_step) for s in buffer.slots if s.target_step == 2] == [("t4", 2)]
    assert buffer.slots[2].meta.target_step == 2
    assert buffer.count_for_target_step(4) == 1 and buffer.count_for_target_step(5) == 1
    assert buffer.promote_ready_group(to_target_step=9) is None


def test_replay_index_round_trips_and_rejects_what_does_not_fit() -> None:
    buffer = new_buffer()
    add(buffer, "a", start=0, target=0)
    add(buffer, "running", start=0, target=0, ready=False)
    add(buffer, "b", start=1, target=1)
    state = buffer.state_dict()
    assert [g["prompt_id"] for g in state["groups"]] == ["a", "b"]  # metadata only, committed groups only
    restored = TQReplayBuffer(buffer.data_plane)
    assert restored.load_state_dict(state, max_groups=4, expected_group_size=GROUP_SIZE) == 2
    assert [m.prompt_id for m in restored.ready_metas()] == ["a", "b"]
    assert restored.ready_metas()[1].keys == buffer.ready_metas()[1].keys
    with pytest.raises(BufferError, match="already in the buffer"):
        restored.load_state_dict(state, max_groups=4, expected_group_size=GROUP_SIZE)
    tampered = {**state, "groups": [{**state["groups"][0], "start_weight": 9}, state["groups"][1]]}
    with pytest.raises(ResumeMismatch, match="digest does not match"):
        new_buffer().load_state_dict(tampered, max_groups=4, expected_group_size=GROUP_SIZE)
    with pytest.raises(ResumeMismatch, match=f"num_generations_per_prompt is 3 but .* has {GROUP_SIZE} generations"):
        new_buffer().load_state_dict(state, max_groups=4, expected_group_size=3)
    with pytest.raises(ResumeMismatch, match="max_buffered_rollouts >= 2"):
        new_buffer().load_state_dict(state, max_groups=1, expected_group_size=GROUP_SIZE)


def test_rows_carry_truncation() -> None:
    buffer = new_buffer()
    group = scored("p")
    truncated = group.generations[0].__class__((4, 1), (-0.1, -0.2), "length", 0)
    group = group.__class__(group.prompt, (truncated, group.generations[1]), group.rewards)
    group_id = buffer.reserve(prompt_id="p", weight_version=0, target_step=None)
    meta = asyncio.run(buffer.commit(group_id, group, start_weight=0, end_weight=0))
    flags = buffer.data_plane.get(list(meta.keys), ["truncated"])["truncated"]
    assert [bool(f) for f in flags] == [True, False] and flags[0].dtype == torch.bool
