"""Dynamic sampling (``grpo.use_dynamic_sampling``) through a real controller: filter, refill, cap, checkpoint.

The engine is the FAKE ScriptedEngine (scripted completions); the buffer, in-order sampler, data plane, dataset,
prompt stream, arithmetic environment and the controller are real. Prompts are not shuffled (see test_drops.py).
A *constant* prompt is answered right every time (rewards all 1: zero variance); any other alternates right and
wrong answers, so its group of two has one of each.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Collection

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.config import SCConfig, load_config
from sc_lightning.controller.api import ControllerStats, GroupMeta, RolloutPumpError
from sc_lightning.controller.controller import SingleController
from sc_lightning.controller.dynamic_sampling import FILTER_REASON, zero_reward_variance
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.controller.helpers import scored
from tests.helpers.drops import DATASET, make, prompt_id, run, train
from tests.helpers.scripts import TOKENIZER, answer_correctly


def dynamic_config(*, n: int = 2, max_gen_batches: int = 10) -> SCConfig:
    """In-order GRPO (no lookahead), n prompts x 2 generations per step, unshuffled, dynamic sampling on."""
    return load_config(
        {
            "grpo": {
                "num_prompts_per_step": n,
                "num_generations_per_prompt": 2,
                "max_num_epochs": 1,
                "seed": 3,
                "use_dynamic_sampling": True,
                "dynamic_sampling_max_gen_batches": max_gen_batches,
            },
            "policy": {"train_global_batch_size": 2 * n, "generation": {"max_new_tokens": 3}},
            "data": {"shuffle": False},
            "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 0}},
            "data_plane": {"backend": "memory"},
        }
    )


def constant_for(constant: Collection[int]):
    """A script: right answers for the constant prompts; for the others right, wrong, right, ... per prompt."""
    tokens = {DATASET[i].token_ids for i in constant}
    seen: Counter[tuple[int, ...]] = Counter()

    def respond(prompt: tuple[int, ...], call: int) -> tuple[int, ...]:
        """Answer; wrong on every second request of a varying prompt."""
        seen[prompt] += 1
        right = answer_correctly(prompt, call)
        return right if prompt in tokens or seen[prompt] % 2 else (*right, *TOKENIZER.encode("7"))

    return respond


def filtered_ids(stats: ControllerStats) -> list[str]:
    """The prompt ids of the groups filtered for the step these stats closed."""
    return [record["prompt_id"] for record in stats.last_step.filtered]


def rewards_of(controller: SingleController, groups: list[GroupMeta]) -> list[list[float]]:
    """Each selected group's rewards, read from the data plane."""
    rows = controller.data_plane.get([key for group in groups for key in group.keys], ["total_reward"])
    flat = [float(r) for r in rows["total_reward"]]
    return [flat[2 * i : 2 * i + 2] for i in range(len(groups))]


def test_the_filter_is_zero_variance_over_every_reward_masked_included() -> None:
    assert zero_reward_variance(scored("p", (1.0, 1.0))) == FILTER_REASON
    assert zero_reward_variance(scored("p", (0.0, 1.0))) is None
    masked = scored("p", (1.0, 0.0))
    masked = type(masked)(masked.prompt, masked.generations, masked.rewards, frozenset({1}))
    assert zero_reward_variance(masked) is None  # the masked reward still moves the baseline of the other


def test_filtered_groups_never_train_and_fresh_prompts_refill_their_step() -> None:
    controller = make(dynamic_config(), engine=ScriptedEngine(constant_for({0, 3, 4})))
    trained, stats = run(controller, 2, n=2)
    # step 0: 0 filtered, refilled from the next batch (2, 3: 3 is a spare); step 1 admits 4, 5: 4 filtered,
    # refilled by spare 3 (filtered too), then by the next batch (6, 7: 7 is a spare)
    assert trained == [sorted([prompt_id(1), prompt_id(2)]), sorted([prompt_id(5), prompt_id(6)])]
    assert [filtered_ids(s) for s in stats] == [[prompt_id(0)], [prompt_id(4), prompt_id(3)]]
    assert stats[0].last_step.filtered[0]["filtered"] == FILTER_REASON
    assert (
        stats[0].last_step.filtered[0]["rewards"] == [1.0, 1.0] and stats[0].last_step.filtered[0]["prompt_index"] == 0
    )
    assert [s.last_step.extra_generations for s in stats] == [1, 2]
    assert stats[-1].filtered == 3 and stats[-1].extra_generations == 3
    assert [p.prompt_id for p in controller.reserve.spares] == [prompt_id(7)]
    assert controller.manager.goodput.snapshot().wasted_tokens > 0  # the filtered groups' completions


def test_selected_groups_all_have_reward_variance() -> None:
    controller = make(dynamic_config(), engine=ScriptedEngine(constant_for({0, 2, 5})))

    async def scenario():
        await controller.start()
        try:
            chosen = []
            for version in range(2):
                step = []
                while len(step) < 2:
                    step += await controller.select(version, 1, 2 - len(step), timeout_s=30)
                chosen.append(rewards_of(controller, step))
                await controller.begin_refit(version + 1)
                await controller.finish_refit(version + 1)
            return chosen
        finally:
            await controller.shutdown()

    for step in asyncio.run(scenario()):
        assert len(step) == 2 and all(max(group) > min(group) for group in step), step


def test_a_step_past_its_cap_stops_the_run_naming_the_step_and_the_knob() -> None:
    controller = make(dynamic_config(max_gen_batches=2), engine=ScriptedEngine(constant_for(range(16))))
    with pytest.raises(RolloutPumpError, match=r"step 0: .*dynamic_sampling_max_gen_batches=2"):
        run(controller, 1, n=2)
    assert controller.dynamic is not None and controller.dynamic.totals["extra_generations"] == 2  # (2 - 1) x 2


def test_with_the_dataset_spent_a_filtered_group_shrinks_its_step() -> None:
    constant = set(range(2, 16))  # only prompts 0 and 1 vary
    controller = make(dynamic_config(max_gen_batches=100), engine=ScriptedEngine(constant_for(constant)))
    trained, stats = run(controller, 2, n=2)
    assert trained[0] == sorted([prompt_id(0), prompt_id(1)])
    assert trained[1] == []  # every later prompt was filtered and none is left: the step closed empty
    assert len(stats[1].last_step.filtered) == 14 and stats[1].extra_generations == 12


@settings(max_examples=12, deadline=None)
@given(constant=st.sets(st.integers(0, 11), max_size=6), steps_first=st.integers(1, 2))
def test_a_checkpoint_cut_keeps_every_prompt_exactly_once(constant: set[int], steps_first: int) -> None:
    """Train, cut, resume in a fresh controller, train on: no prompt is trained twice or both trained and filtered,
    and every prompt taken from the stream before the end is trained, filtered, or still owed."""
    cfg = dynamic_config(max_gen_batches=100)
    first = make(cfg, engine=ScriptedEngine(constant_for(constant)))

    async def before_cut():
        await first.start()
        try:
            trained, stats = await train(first, steps_first, n=2)
            return trained, stats, first.checkpoint_state()
        finally:
            await first.shutdown()

    trained_a, stats_a, state = asyncio.run(before_cut())
    second = make(cfg, engine=ScriptedEngine(constant_for(constant)))

    async def after_cut():
        await second.restore(state, group_size=2)
        await second.start()
        try:
            trained, stats = await train(second, 1, n=2, first=steps_first)
            async with second.checkpoint_barrier():
                return trained, stats, second.checkpoint_state(index_rows=False)  # buffered groups listed as owed
        finally:
            await second.shutdown()

    trained_b, stats_b, end = asyncio.run(after_cut())
    trained = [p for step in trained_a + trained_b for p in step]
    filtered = [p for s in stats_a + stats_b for p in filtered_ids(s)]
    assert len(trained) == len(set(trained)), "a prompt trained twice"
    assert len(filtered) == len(set(filtered)), "a prompt filtered twice"
    assert not set(trained) & set(filtered), "a filtered prompt was trained"
    assert not {prompt_id(i) for i in constant} & set(trained), "a zero-variance group was trained"
    owed = [e["prompt"]["prompt_id"] for e in end["pending"]] + [e["prompt_id"] for e in end["replacement_reserve"]]
    taken = {prompt_id(i) for i in range(end["prompts"]["position"] * 2)}
    assert sorted(trained + filtered + owed) == sorted(taken), "a prompt taken from the stream was lost or repeated"


def test_a_cut_while_a_refill_is_in_flight_owes_the_refill_not_the_filtered_prompt() -> None:
    cfg = dynamic_config()
    engine = ScriptedEngine(constant_for({0}), gated=True)
    first = make(cfg, engine=engine)

    async def cut_mid_refill():
        await first.start()
        try:
            for i in (0, 1):
                engine.release(DATASET[i].token_ids)  # 0 is filtered, its slot refilled with prompt 2 (held)
            await first.wait_until(lambda: prompt_id(2) in {g.prompt_id for g in first.manager.inflight.values()}, 30)
            async with first.checkpoint_barrier():
                return first.checkpoint_state(index_rows=False)
        finally:
            await first.shutdown()

    state = asyncio.run(cut_mid_refill())
    owed = [entry["prompt"]["prompt_id"] for entry in state["pending"]]
    assert sorted(owed) == sorted([prompt_id(1), prompt_id(2)])  # the committed 1 (no rows saved) and the refill
    assert [entry["prompt_id"] for entry in state["replacement_reserve"]] == [prompt_id(3)]
    assert [record["prompt_id"] for record in state["dynamic_sampling"]["filtered"]["0"]] == [prompt_id(0)]

    second = make(cfg, engine=ScriptedEngine(constant_for({0})))

    async def resume():
        await second.restore(state, group_size=2)
        await second.start()
        try:
            return await train(second, 1, n=2)
        finally:
            await second.shutdown()

    trained, stats = asyncio.run(resume())
    assert trained == [sorted([prompt_id(1), prompt_id(2)])]
    assert filtered_ids(stats[0]) == [prompt_id(0)] and stats[0].last_step.extra_generations == 1
