"""With token capture a conversation interrupted by a retry or an eviction goes on after its last sealed turn.

The engine is the FAKE ScriptedEngine (a scripted calculator user: call the tool, then answer); the rollout manager,
the driver, the calculator environment, the chat template, the ledger entry and the replay buffer are real. A refit
lands between the interruption and the resumption, so a sealed turn generated again would carry the new version.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import pytest

from sc_lightning.config.runtime import RolloutRecoveryConfig
from sc_lightning.controller.buffer import TQReplayBuffer
from sc_lightning.controller.recovery import PendingGroup, RecoveryPolicy
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.manager import RolloutManager, RolloutSettings, ServedPolicy
from sc_lightning.rollout.multiturn import CalculatorEnvironment, MultiTurnSource, TurnLimits, calculator_prompts
from sc_lightning.rollout.multiturn.chat import chat_template_for
from sc_lightning.rollout.multiturn.protocol import Observation
from sc_lightning.rollout.multiturn.record import SealedTurn, TurnRecord
from sc_lightning.rollout.multiturn.source import ScoredByEpisodes
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.types import Generation, SamplingParams
from tests.helpers.scripts import TOKENIZER, calculator_user

PROMPT = calculator_prompts(1, seed=5)[0]
CALL = len(PROMPT.text) + 1  # the first turn: the expression and eos
TOOL = len(PROMPT.answer) + 1  # the calculator's answer and "="
ANSWER = len(PROMPT.answer) + 1  # the second turn: the product and eos


def conversation_manager(engine: ScriptedEngine) -> RolloutManager:
    """One conversation per group over a real replay buffer; an infrastructure failure is retried once, at once."""
    settings = RolloutSettings(
        1, SamplingParams(max_new_tokens=16), 30.0, 30.0, max_infra_attempts=2, backoff_base_s=0.0
    )
    manager = RolloutManager(
        ServedPolicy(engine), ScoredByEpisodes("calculator"), TOKENIZER, TQReplayBuffer(MemoryDataPlane()), settings
    )
    manager.sample_source = MultiTurnSource(
        manager, CalculatorEnvironment(), chat_template_for(TOKENIZER), TurnLimits()
    )
    return manager


def captured() -> PendingGroup:
    """The ledger entry of PROMPT with token capture on (sibling granularity)."""
    return RecoveryPolicy(RolloutRecoveryConfig(), token_capture=True).pending(PROMPT, None)


def assert_resumed_after_the_first_turn(entry: PendingGroup) -> None:
    """The committed conversation kept its first turn from version 0 and regenerated only its answer at version 1."""
    assert entry.conversations is not None
    record = entry.conversations[0]
    assert record.score is not None and record.score.reward == 1.0
    assert record.generation is not None
    assert TOKENIZER.decode(record.generation.token_ids) == f"{PROMPT.text}{PROMPT.answer}={PROMPT.answer}"
    assert record.generation.token_versions == (0,) * (CALL + TOOL) + (1,) * ANSWER
    assert record.generation.weight_version == 0
    assert [turn.generation.weight_version for turn in record.turns] == [0]  # only the call was sealed


def test_a_retried_conversation_keeps_its_sealed_turn() -> None:
    """The answer's request fails (an engine error: infra, retried); the retry asks only for the answer again."""
    engine = ScriptedEngine(calculator_user, fail_on=1)
    original = engine.generate

    async def refit_before_the_failure(ids, sampling):  # noqa: ANN001, ANN202
        if engine.calls == 1:
            await engine.update_weights([], 1)
            manager.served.version = 1
        return await original(ids, sampling)

    engine.generate = refit_before_the_failure
    manager, entry = conversation_manager(engine), captured()
    meta = asyncio.run(manager.generate_and_push(PROMPT, sealed=entry.sealed, conversations=entry.conversations))
    assert manager.failures == {"infra": 1, "data": 0, "redispatched": 1}
    assert engine.calls == 3  # the call, the failed answer, the answer again: the call was not generated again
    assert meta.start_weight == 0  # the group is as old as its sealed turn
    assert_resumed_after_the_first_turn(entry)


def test_an_evicted_conversation_resumes_after_its_sealed_turn() -> None:
    """The rollout is cancelled while its answer is generated, then dispatched again from its ledger entry."""
    engine, entry = ScriptedEngine(calculator_user, gated=True), captured()

    async def scenario() -> None:
        manager = conversation_manager(engine)
        push = manager.generate_and_push(PROMPT, sealed=entry.sealed, conversations=entry.conversations)
        task = asyncio.create_task(push)
        await engine.wait_for_requests(1, timeout_s=10)
        engine.release(PROMPT.token_ids)  # the call finishes, the calculator answers: the first turn is sealed
        await engine.wait_for_requests(2, timeout_s=10)  # the answer's request is parked
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert entry.conversations is not None and len(entry.conversations[0].turns) == 1
        await engine.update_weights([], 1)
        manager.served.version = 1
        engine.release_all()
        await manager.generate_and_push(PROMPT, sealed=entry.sealed, conversations=entry.conversations)

    asyncio.run(scenario())
    assert engine.calls == 3  # the call, the cancelled answer, the answer again
    assert_resumed_after_the_first_turn(entry)


def test_a_diverging_replay_plays_the_conversation_again_whole(caplog: pytest.LogCaptureFixture) -> None:
    """A sealed turn the fresh episode answers differently is dropped: the conversation starts over."""
    engine, entry = ScriptedEngine(calculator_user), captured()
    assert entry.conversations is not None
    wrong = Generation(tuple(TOKENIZER.encode(PROMPT.text)) + (TOKENIZER.EOS,), (-0.1,) * CALL, "stop", 0)
    entry.conversations[0].turns.append(SealedTurn(wrong, Observation("1")))  # the calculator would not say 1
    asyncio.run(conversation_manager(engine).generate_and_push(PROMPT, conversations=entry.conversations))
    assert f"prompt {PROMPT.prompt_id}: turn 1 replayed" in caplog.text
    assert engine.calls == 2 and entry.conversations[0].score is not None
    assert entry.conversations[0].turns[0].observation == Observation(f"{PROMPT.answer}")


def test_conversation_records_round_trip_and_old_entries_load_without_them() -> None:
    """rollout_recovery.pt keeps each conversation's sealed turns; an entry saved before them has none."""
    turn = SealedTurn(Generation((5, 6), (-0.2, -0.3), "stop", 3, (3, 4)), Observation("408"))
    finished = Generation((5, 6, 7, 8), (-0.2, -0.3, 0.0, -0.1), "stop", 3, (3, 4, 4, 5), (True, True, False, True))
    entry = captured()
    assert entry.conversations is not None
    entry.conversations[0].turns.append(turn)
    entry.conversations[2] = TurnRecord([turn], finished, entry.conversations[0].score)
    saved = json.loads(json.dumps(entry.to_dict()))
    assert [record["index"] for record in saved["conversations"]] == [0, 2]
    restored = PendingGroup.from_dict(saved, capture=True)
    assert restored.conversations == entry.conversations
    assert restored.conversations is not None and restored.conversations[0].turns == [turn]
    del saved["conversations"]  # a snapshot written before conversations were recorded
    old = PendingGroup.from_dict(saved, capture=True)
    assert old.conversations == {} and isinstance(old.conversations, defaultdict)
