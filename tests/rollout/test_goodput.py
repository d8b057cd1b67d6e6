"""The engine goodput accounts: every second of wall time lands in one part, every finished token in one fate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.callbacks.goodput import lookahead_of
from sc_lightning.config.samplers import (
    CustomSamplerConfig,
    InOrderSamplerConfig,
    SamplerConfig,
    WeightFifoSamplerConfig,
    WindowedSamplerConfig,
)
from sc_lightning.rollout.goodput import EngineGoodput, EngineTime
from sc_lightning.trainer.goodput import allocation_advice


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_groups_in_flight_share_the_busy_time_and_follow_their_fate() -> None:
    clock = Clock()
    accounts = EngineGoodput(clock)
    clock.now = 1.0  # idle: nothing in flight
    accounts.started("a")
    clock.now = 3.0  # a alone: 2 s
    accounts.started("b")
    accounts.generated("a", 5)
    clock.now = 5.0  # a and b share 2 s: 1 s each
    accounts.committed("a")  # a: 3 s, 5 tokens, buffered
    accounts.stand_down()
    clock.now = 9.0  # stood down: b accrues nothing
    accounts.wake()
    accounts.generated("b", 7)
    clock.now = 10.0  # b alone: 1 s
    accounts.failed("b")  # b: 2 s and 7 tokens wasted
    assert accounts.snapshot() == EngineTime(pending_s=3.0, wasted_s=2.0, stood_down_s=4.0, idle_s=1.0, wasted_tokens=7)
    accounts.trained(["a"])
    clock.now = 12.0
    assert accounts.snapshot() == EngineTime(
        trained_s=3.0, wasted_s=2.0, stood_down_s=4.0, idle_s=3.0, trained_tokens=5, wasted_tokens=7
    )


def test_a_group_reusing_completions_counts_them_when_it_commits() -> None:
    """Token capture: completions kept across a failed attempt are counted with the group that uses them."""
    accounts = EngineGoodput(Clock())
    accounts.started("first")
    accounts.failed("first")  # its sealed completions were not reported through generated()
    accounts.started("second")
    accounts.committed("second", tokens=12)
    accounts.evicted(["second"])
    assert (accounts.snapshot().trained_tokens, accounts.snapshot().wasted_tokens) == (0, 12)


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["start", "generate", "commit", "fail", "train", "evict", "stand_down", "wake"]),
        st.integers(0, 5),  # which group
        st.floats(0.0, 3.0),  # seconds before the event
        st.integers(0, 9),  # tokens
    ),
    max_size=60,
)


@given(EVENTS)
def test_the_parts_always_sum_to_the_wall_time_and_tokens_are_never_lost(events) -> None:
    clock = Clock()
    accounts = EngineGoodput(clock)
    running: set[str] = set()
    buffered: dict[str, int] = {}
    generated: dict[str, int] = {}
    fates = {"trained": 0, "wasted": 0}
    for kind, index, wait, tokens in events:
        clock.now += wait
        group = f"g{index}"
        if kind == "start" and group not in running and group not in buffered:
            accounts.started(group)
            running.add(group)
        elif kind == "generate" and group in running:
            accounts.generated(group, tokens)
            generated[group] = generated.get(group, 0) + tokens
        elif kind in ("commit", "fail") and group in running:
            running.discard(group)
            made = generated.pop(group, 0)
            if kind == "commit":
                accounts.committed(group)
                buffered[group] = made
            else:
                accounts.failed(group)
                fates["wasted"] += made
        elif kind in ("train", "evict") and group in buffered:
            getattr(accounts, "trained" if kind == "train" else "evicted")([group])
            fates["trained" if kind == "train" else "wasted"] += buffered.pop(group)
        elif kind in ("stand_down", "wake"):
            getattr(accounts, kind)()
    snapshot = accounts.snapshot()
    assert snapshot.wall_s == pytest.approx(clock.now, abs=1e-9)
    assert min(snapshot.parts().values()) >= -1e-12
    assert (snapshot.trained_tokens, snapshot.wasted_tokens) == (fates["trained"], fates["wasted"])
    if not running and not buffered:
        assert snapshot.pending_s == pytest.approx(0.0, abs=1e-9)


def test_the_advice_splits_the_devices_so_both_pumps_take_the_same_time() -> None:
    trainer = {"productive": 30.0, "wait_rollouts": 50.0, "refit": 5.0, "checkpoint": 0.0, "other": 5.0}
    engine = EngineTime(trained_s=88.0, wasted_s=10.0, idle_s=2.0, trained_tokens=900, wasted_tokens=100)
    advice = allocation_advice(trainer, engine, steps=10, devices=(4, 4))
    # per step generation needs 9.8 engine-seconds on 4 devices, training 4 s on 4: 9.8:4 of 8 devices is 5.7 : 2.3
    assert "busy 9.80 s and training took 4.00 s" in advice
    assert (
        "more generation devices, not lookahead; of the 8 devices, about 6 for generation and 2 for training" in advice
    )
    assert "900 tokens trained, 100 wasted" in advice


TRAINER = {"productive": 50.0, "refit": 5.0, "checkpoint": 0.0, "other": 15.0}  # and wait_rollouts: T = 7 s a step
VERDICTS = {
    "barely": "the trainer barely waited",
    "colocated": "take turns on the same devices",
    "admission": "admission held generation back",
    "bottleneck": "generation is the bottleneck",
}


@pytest.mark.parametrize(
    ("wait_s", "engine", "verdict", "devices_said"),
    [
        (2.0, EngineTime(trained_s=40.0, idle_s=60.0), "barely", "keep pace on about 0.57x its devices"),
        # the colocated run: generation is faster than training, but the two cannot overlap
        (30.0, EngineTime(trained_s=50.0, stood_down_s=48.0, idle_s=2.0), "colocated", None),
        (30.0, EngineTime(trained_s=50.0, stood_down_s=30.0, idle_s=20.0), "colocated", None),
        (30.0, EngineTime(trained_s=60.0, idle_s=40.0), "admission", None),
        (60.0, EngineTime(trained_s=98.0, idle_s=2.0), "bottleneck", "keep pace on about 1.40x its devices"),
    ],
)
def test_the_advice_gives_one_verdict(
    wait_s: float, engine: EngineTime, verdict: str, devices_said: str | None
) -> None:
    trainer = {**TRAINER, "wait_rollouts": wait_s}
    advice = allocation_advice(trainer, engine, steps=10)
    (line,) = [line for line in advice.splitlines() if "advice:" in line]
    assert [name for name, phrase in VERDICTS.items() if phrase in advice] == [verdict], advice
    if devices_said is None:  # no device figure that could point the other way
        assert "its devices" not in advice and "more generation devices" not in advice, advice
    else:
        assert devices_said in line


@pytest.mark.parametrize(
    ("off_policy", "said", "not_said"),
    [
        (False, "one step of lookahead (async_rl.sampler.max_lookahead_versions: 1) keeps", "if not on"),
        (None, "max_lookahead_versions: 1, if not on) keeps", "already"),
        (True, "the lookahead in use already lets the next step's prompts fill", "max_lookahead_versions"),
    ],
)
def test_the_colocated_advice_suggests_lookahead_only_where_the_run_had_none(
    off_policy: bool | None, said: str, not_said: str
) -> None:
    trainer = {**TRAINER, "wait_rollouts": 30.0}
    engine = EngineTime(trained_s=50.0, stood_down_s=48.0, idle_s=2.0)
    (line,) = [
        line
        for line in allocation_advice(trainer, engine, steps=10, off_policy=off_policy).splitlines()
        if "advice:" in line
    ]
    assert said in line and not_said not in line, line
    assert "policy.generation.colocated.enabled: false" in line  # separate devices are the remedy either way


@pytest.mark.parametrize(
    ("sampler", "expected"),
    [
        (InOrderSamplerConfig(max_lookahead_versions=0), (False, "async_rl.sampler.max_lookahead_versions")),
        (InOrderSamplerConfig(max_lookahead_versions=1), (True, "async_rl.sampler.max_lookahead_versions")),
        (WeightFifoSamplerConfig(max_staleness_versions=0), (False, "async_rl.sampler.max_staleness_versions")),
        (WindowedSamplerConfig(max_staleness_versions=2), (True, "async_rl.sampler.max_staleness_versions")),
        (CustomSamplerConfig(target="my.samplers:Mine"), (None, "async_rl.sampler.max_lookahead_versions")),
    ],
    ids=["in_order-0", "in_order-1", "weight_fifo-0", "windowed-2", "custom"],
)
def test_the_advice_names_the_run_samplers_own_lookahead_knob(
    sampler: SamplerConfig, expected: tuple[bool | None, str]
) -> None:
    off_policy, knob = lookahead_of(sampler)
    assert (off_policy, knob) == expected
    trainer = {**TRAINER, "wait_rollouts": 30.0}
    engine = EngineTime(trained_s=50.0, stood_down_s=48.0, idle_s=2.0)
    advice = allocation_advice(trainer, engine, steps=10, off_policy=off_policy, lookahead_knob=knob)
    if off_policy:
        assert "lookahead in use already" in advice and knob not in advice
    else:  # the knob to turn, the run's own: a weight_fifo run is not told of in_order's
        assert f"({knob}: 1" in advice, advice
