"""Drop budgets, shrinking steps, the replacement reserve and borrowing, through a real controller.

The engine is the FAKE ScriptedEngine (scripted completions, test-controlled timing); the buffer, samplers, data
plane, dataset, prompt stream, environment and drop ledger are real. Prompts are not shuffled, so step k of n
prompts holds dataset prompts k*n .. k*n+n-1 (before any reserve diverts a batch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from sc_lightning.controller.api import RolloutPumpError
from sc_lightning.controller.drops import DropBudgetExhausted, DropBudgets, DropLedger, StepBelowFloor
from sc_lightning.engines.base import EngineError
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.drops import DATASET, drop_config, make, prompt_id, run, train
from tests.helpers.scripts import answer_correctly


def unreachable_for(bad: Collection[int]):
    """A script that answers correctly, except that the engine fails (an infra failure) for the given prompts."""
    tokens = {DATASET[i].token_ids for i in bad}

    def respond(prompt: tuple[int, ...], call: int) -> tuple[int, ...]:
        """Fail for a bad prompt, else answer."""
        if prompt in tokens:
            raise EngineError("scripted: replica unreachable")
        return answer_correctly(prompt, call)

    return respond


def ids(*indices: int) -> list[str]:
    """Sorted prompt ids of dataset prompts."""
    return sorted(prompt_id(i) for i in indices)


# ---------------------------------------------------------------------------------------------- the ledger alone


def test_the_ledger_charges_data_drops_to_the_run_and_infra_drops_to_the_current_run_of_failures() -> None:
    ledger = DropLedger(DropBudgets(groups_per_step=8, max_skipped_prompts=2, max_consecutive_dropped_prompts=1))
    failure = RuntimeError("prompt p: broke")
    ledger.allow_drop(failure, "data")
    ledger.allow_drop(failure, "infra")
    ledger.on_commit()  # ends the run of infra drops, not the data total
    ledger.allow_drop(failure, "infra")
    ledger.allow_drop(failure, "data")
    with pytest.raises(DropBudgetExhausted, match=r"max_skipped_prompts=2 \(2 so far\)") as spent:
        ledger.allow_drop(failure, "data")
    assert spent.value.__cause__ is failure
    with pytest.raises(DropBudgetExhausted, match=r"2 prompt group\(s\) in a row .*max_consecutive_dropped_prompts=1"):
        ledger.allow_drop(failure, "infra")
    assert ledger.totals["dropped"] == 4


def test_with_no_budget_the_failure_itself_stops_the_run() -> None:
    ledger = DropLedger(DropBudgets(groups_per_step=8))
    failure = RuntimeError("prompt p: broke")
    for kind in ("data", "infra"):
        with pytest.raises(RuntimeError) as raised:
            ledger.allow_drop(failure, kind)
        assert raised.value is failure


def test_shortfalls_shrink_steps_down_to_the_floor_and_close_with_their_step() -> None:
    ledger = DropLedger(DropBudgets(groups_per_step=8, max_skipped_prompts=9, min_step_batch_fraction=0.7))
    assert ledger.budgets.step_floor == 6  # ceil(8 x 0.7)
    ledger.shrink(3, current_step=2, prompt_id="a")
    ledger.shrink(3, current_step=2, prompt_id="b")
    ledger.shrink(None, current_step=2, prompt_id="c")  # unstamped: counted for the current step, nothing waits
    ledger.shrink(1, current_step=2, prompt_id="d")  # a step already trained: nothing waits for it either
    assert (ledger.target_groups(3), ledger.target_groups(2)) == (6, 8)
    with pytest.raises(StepBelowFloor, match=r"step 3 lost 3 of 8 .*prompt e.* floor of 6.*on_dropped_prompt: replace"):
        ledger.shrink(3, current_step=2, prompt_id="e")
    assert ledger.target_groups(3) == 6  # never below the floor: the step waits until the failure stops the run
    restored = DropLedger(ledger.budgets)
    restored.load_state_dict(ledger.state_dict())
    assert restored.target_groups(3) == 6 and restored.totals == ledger.totals
    assert ledger.close_step(2).dropped == 1
    assert ledger.close_step(3).dropped == 3 and ledger.target_groups(3) == 8  # forgotten once closed


# ---------------------------------------------------------------------------------------------- shrink


def test_a_data_failure_within_the_skip_budget_shrinks_its_step() -> None:
    cfg = drop_config(n=4, max_skipped_prompts=2, min_step_batch_fraction=0.5)
    trained, stats = run(make(cfg, bad_data=[5, 6]), steps=4, n=4)
    assert trained == [ids(0, 1, 2, 3), ids(4, 7), ids(8, 9, 10, 11), ids(12, 13, 14, 15)]
    assert [s.last_step.dropped for s in stats] == [0, 2, 0, 0]
    final = stats[-1]
    assert (final.dropped, final.data_failures, final.redispatched, final.infra_failures) == (2, 4, 2, 0)
    assert final.buffer_permits_held == 0 and final.committed == 14


def test_a_spent_skip_budget_stops_the_run_naming_the_prompt_and_the_knob() -> None:
    cfg = drop_config(n=4, max_skipped_prompts=1, min_step_batch_fraction=0.5)
    with pytest.raises(RolloutPumpError, match=rf"prompt {prompt_id(6)} .*max_skipped_prompts=1 \(1 so far\)"):
        run(make(cfg, bad_data=[5, 6]), steps=4, n=4)


def test_a_drop_below_the_floor_stops_the_run() -> None:
    cfg = drop_config(n=4, max_skipped_prompts=3, min_step_batch_fraction=0.75)
    with pytest.raises(RolloutPumpError, match=r"step 1 lost 2 of 4 prompt groups .*below the floor of 3"):
        run(make(cfg, bad_data=[5, 6]), steps=4, n=4)


def test_infra_drops_are_bounded_by_the_consecutive_budget() -> None:
    cfg = drop_config(n=4, max_consecutive_dropped_prompts=1, min_step_batch_fraction=0.5)
    trained, stats = run(make(cfg, engine=ScriptedEngine(unreachable_for([5]))), steps=4, n=4)
    assert trained[1] == ids(4, 6, 7) and stats[1].last_step.dropped == 1
    assert (stats[-1].infra_failures, stats[-1].redispatched, stats[-1].dropped) == (2, 1, 1)

    every_prompt_of_step_1 = make(cfg, engine=ScriptedEngine(unreachable_for([4, 5, 6, 7])))
    with pytest.raises(RolloutPumpError, match=r"2 prompt group\(s\) in a row failed on infrastructure"):
        run(every_prompt_of_step_1, steps=4, n=4)


# ---------------------------------------------------------------------------------------------- replace


def test_a_spare_from_the_reserve_replaces_a_dropped_group() -> None:
    cfg = drop_config(
        n=2, max_skipped_prompts=1, on_dropped_prompt="replace", replacement_reserve_prompts=2
    )  # the fraction's floor of 2 forbids shrinking: only a replacement keeps the run going
    controller = make(cfg, bad_data=[4])
    trained, stats = run(controller, steps=7, n=2)
    # batch 1 (prompts 2, 3) went to the reserve once step 0 was stamped; spare 2 replaced the dropped prompt 4;
    # batch 3 (6, 7) topped the reserve up again; once the dataset ran out, spares 3 and 6 made a last step
    assert trained == [ids(0, 1), ids(2, 5), ids(8, 9), ids(10, 11), ids(12, 13), ids(14, 15), ids(3, 6)]
    assert [s.last_step.replaced for s in stats] == [0, 1, 0, 0, 0, 0, 0]
    assert (stats[-1].dropped, stats[-1].replaced, stats[-1].promoted) == (1, 1, 0)
    assert [p.prompt_id for p in controller.reserve.spares] == [prompt_id(7)]  # fewer than a step: not trained


def test_a_replacing_run_below_the_floor_is_told_to_hold_more_spares_not_to_replace() -> None:
    ledger = DropLedger(DropBudgets(groups_per_step=2, min_step_batch_fraction=1.0, replacing=True))
    with pytest.raises(StepBelowFloor, match=r"replacement_reserve_prompts or max_replacement_attempts") as raised:
        ledger.shrink(0, current_step=0, prompt_id="a")
    assert "on_dropped_prompt: replace" not in str(raised.value)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_spares_wait_for_the_last_dataset_rollouts_before_they_train_as_a_step_of_their_own(fraction) -> None:
    """The dispatch gate is wide open, so the pump reaches the dataset's end at once; the last dataset prompt (15)
    is held until six steps have trained and then dropped: a spare must still be there to take its place."""
    engine = ScriptedEngine(answer_correctly, gated=True)
    cfg = drop_config(
        n=2,
        lookahead=7,
        max_skipped_prompts=1,
        on_dropped_prompt="replace",
        replacement_reserve_prompts=2,
        min_step_batch_fraction=fraction,
    )
    controller = make(cfg, engine=engine, bad_data=[15])

    async def scenario():
        for index in range(15):
            engine.release(DATASET[index].token_ids)
        await controller.start()
        try:
            trained, _ = await train(controller, 6, n=2)  # batch 1 (prompts 2, 3) went to the reserve
            engine.release(DATASET[15].token_ids)  # its scoring fails twice: dropped
            last, stats = await train(controller, 1, n=2, first=6)
            leftover = await controller.select(7, 1, 2, timeout_s=30)
            return trained + last, stats[-1], leftover
        finally:
            await controller.shutdown()

    trained, stats, leftover = asyncio.run(scenario())
    # spare 2 took the dropped prompt's place in the last dataset step, which stayed whole; spare 3 is fewer than a
    # step, so no step of spares trains
    assert trained == [ids(0, 1), *(ids(k, k + 1) for k in range(4, 13, 2)), ids(2, 14)]
    assert (stats.last_step.dropped, stats.last_step.replaced, stats.dropped, stats.replaced) == (0, 1, 1, 1)
    assert leftover is None and [p.prompt_id for p in controller.reserve.spares] == [prompt_id(3)]


def test_a_dropped_group_borrows_a_ready_group_of_a_later_step() -> None:
    """Step 1's groups are ready when step 0's prompt 0 is dropped: one is lent to step 0, the spare goes to step 1."""
    engine = ScriptedEngine(answer_correctly, gated=True)
    cfg = drop_config(
        n=2, lookahead=1, max_skipped_prompts=1, on_dropped_prompt="replace", replacement_reserve_prompts=2
    )
    controller = make(cfg, engine=engine, bad_data=[0])

    async def scenario():
        await controller.start()
        await engine.wait_for_requests(8, timeout_s=30)  # steps 0 (prompts 0, 1) and 1 (4, 5; 2, 3 are spares)
        for index in (4, 5, 1):
            engine.release(DATASET[index].token_ids)
        await controller.wait_until(lambda: controller.stats().committed == 3, timeout_s=30)
        engine.release(DATASET[0].token_ids)  # its scoring fails: dropped, replaced by spare 2
        await controller.wait_until(lambda: controller.stats().dropped == 1, timeout_s=30)
        engine.release(DATASET[2].token_ids)
        try:
            return await train(controller, 2, n=2)
        finally:
            await controller.shutdown()

    trained, stats = asyncio.run(scenario())
    assert trained == [ids(1, 4), ids(2, 5)]  # prompt 4's group was lent to step 0; spare 2 trained in step 1
    assert [(s.last_step.promoted, s.last_step.replaced) for s in stats] == [(1, 0), (0, 1)]


def test_the_reserve_and_the_spent_budgets_survive_a_checkpoint() -> None:
    cfg = drop_config(
        n=2,
        max_skipped_prompts=3,
        on_dropped_prompt="replace",
        replacement_reserve_prompts=2,
        min_step_batch_fraction=0.5,
    )
    first = make(cfg, bad_data=[4])

    async def checkpoint_after_two_steps():
        await first.start()
        try:
            await train(first, 2, n=2)
            return first.checkpoint_state()
        finally:
            await first.shutdown()

    state = asyncio.run(checkpoint_after_two_steps())
    spares = [entry["prompt_id"] for entry in state["replacement_reserve"]]
    assert spares[0] == prompt_id(3)  # then 6 and 7 if the pump topped the reserve up before the checkpoint
    assert state["drops"]["skipped"] == 1 and state["drops"]["totals"] == {"dropped": 1, "replaced": 1}

    second = make(cfg, bad_data=[4])

    async def resume():
        await second.restore(state, group_size=2)
        await second.start()
        try:
            return [p.prompt_id for p in second.reserve.spares], second.drops.skipped, second.stats().replaced
        finally:
            await second.shutdown()

    assert asyncio.run(resume()) == (spares, 1, 1)
