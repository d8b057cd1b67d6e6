"""The samplers: admit gating, select and evict per knob, out-of-order completion, cursor resume, capacity."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.config import samplers as cfg
from sc_lightning.controller.samplers import (
    InOrderSampler,
    ReadyFirstSampler,
    SamplerError,
    WeightFifoSampler,
    WindowedSampler,
    create_sampler,
)
from tests.controller.helpers import add, names, new_buffer, scored


def select(sampler, version: int, min_groups: int = 1, max_groups: int = 8):
    return asyncio.run(sampler.select(trainer_version=version, min_groups=min_groups, max_groups=max_groups))


def evict(sampler, version: int):
    return asyncio.run(sampler.evict(trainer_version=version))


def spec_picture_buffer():
    """The spec's picture, written out: one buffer at trainer weight 2, num_prompts_per_step = 2.

        dispatch order ─►   B2     C1        C2     D1     D2     E1
        start_weight         0      1         1      1      1      2
        target_step          1      2         2      3      3      4
        state              ready  running   ready  ready  ready  ready

    B2 is a straggler of step 1's batch that finished late; C1 (step 2's other group) is still generating.
    """
    buffer = new_buffer()
    add(buffer, "B2", start=0, target=1)
    add(buffer, "C1", start=1, target=2, ready=False)
    add(buffer, "C2", start=1, target=2)
    add(buffer, "D1", start=1, target=3)
    add(buffer, "D2", start=1, target=3)
    add(buffer, "E1", start=2, target=4)
    return buffer


@pytest.mark.parametrize(
    ("make", "evicted", "chosen"),
    [
        # in_order trains only step 2's groups: C2 now (C1 when it finishes); the late B2 is evicted (target 1 < 2)
        (lambda b: InOrderSampler(b, gate_window=2), ["B2"], ["C2"]),
        # weight_fifo drains the oldest in-window start_weight first: the straggler B2 (weight 0)
        (lambda b: WeightFifoSampler(b, gate_window=2), [], ["B2"]),
        # ready_first takes any ready group no newer than the trainer, in dispatch order, stragglers included
        (lambda b: ReadyFirstSampler(b, gate_window=2), [], ["B2", "C2"]),
        # windowed [0, 2] takes in-window groups in dispatch order ...
        (lambda b: WindowedSampler(b, max_staleness_versions=2, sample_freshest_first=False), [], ["B2", "C2"]),
        # ... or the freshest first (E1 at lag 0, then the lag-1 groups in dispatch order)
        (lambda b: WindowedSampler(b, max_staleness_versions=2, sample_freshest_first=True), [], ["E1", "C2"]),
        # a narrower window [1, 2] evicts the straggler instead
        (lambda b: WindowedSampler(b, max_staleness_versions=1, sample_freshest_first=False), ["B2"], ["C2", "D1"]),
    ],
    ids=["in_order", "weight_fifo", "ready_first", "windowed", "windowed_freshest", "windowed_S1"],
)
def test_same_buffer_four_different_training_batches(make, evicted, chosen) -> None:
    buffer = spec_picture_buffer()
    sampler = make(buffer)
    assert names(evict(sampler, 2)) == evicted
    assert names(select(sampler, 2, min_groups=1, max_groups=2)) == chosen
    assert not set(chosen) & {s.prompt_id for s in buffer.slots}, "selected groups leave the buffer"


def test_windowed_select_takes_no_group_older_than_its_window_even_before_an_evict() -> None:
    """A group may commit between the trainer's evict and its select: select itself keeps to the window [v - S, v]
    (the straggler B2, start weight 0, is out of [1, 2])."""
    sampler = WindowedSampler(spec_picture_buffer(), max_staleness_versions=1, sample_freshest_first=False)
    assert names(select(sampler, 2, min_groups=1, max_groups=2)) == ["C2", "D1"]


@pytest.mark.parametrize("window", [0, 1, 3])
@pytest.mark.parametrize("kind", [InOrderSampler, WeightFifoSampler, ReadyFirstSampler])
def test_gated_admission_leads_by_the_window(kind, window) -> None:
    sampler = kind(new_buffer(), gate_window=window)
    admitted = 0
    while sampler.can_admit(0):
        stamp = sampler.admit()
        assert stamp == (admitted if kind is InOrderSampler else None)
        admitted += 1
    assert admitted == window + 1  # batches for versions 0..window
    assert sampler.can_admit(1) and sampler.dispatch_index == window
    assert sampler.required_buffer_capacity(4) == 4 * (window + 1)


def test_windowed_admission_is_ungated() -> None:
    sampler = WindowedSampler(new_buffer(), max_staleness_versions=1, sample_freshest_first=False)
    for _ in range(50):
        assert sampler.can_admit(0)
        assert sampler.admit() is None
    assert sampler.required_buffer_capacity(4) is None


@pytest.mark.parametrize(
    ("ratio", "window", "ahead"),
    [
        (1.0, 0, 1),  # floor(1 x 1): one batch, the trainer's own
        (1.0, 1, 2),  # floor(1 x 2): the window's two versions, as weight_fifo's gate
        (1.5, 1, 3),  # floor(1.5 x 2)
        (1.2, 1, 2),  # floor(2.4): whole batches only
        (1.16, 24, 29),  # 1.16 x 25 is 28.999999999999996 in floating point; still 29
    ],
)
def test_windowed_over_sampling_ratio_caps_the_batches_ahead_of_the_trainer(ratio, window, ahead) -> None:
    sampler = WindowedSampler(
        new_buffer(), max_staleness_versions=window, sample_freshest_first=False, over_sampling_ratio=ratio
    )
    admitted = 0
    while sampler.can_admit(0):
        sampler.admit()
        admitted += 1
    assert admitted == ahead
    for version in (1, 2):  # each trainer step lets exactly one more batch in
        assert sampler.can_admit(version)
        sampler.admit()
        assert not sampler.can_admit(version)
    with pytest.raises(SamplerError, match="over_sampling_ratio must be >= 1"):
        WindowedSampler(new_buffer(), max_staleness_versions=1, sample_freshest_first=False, over_sampling_ratio=0.5)


def capped_picture_buffer() -> tuple:
    """Trainer at 2, window 1 ([1, 2]): step 2's own batch (weight 1, leaving the window after this step) has one
    group ready and one still generating; the next batch (weight 2) has two groups ready already."""
    buffer = new_buffer()
    add(buffer, "own1", start=1)
    straggler = add(buffer, "own2", start=1, ready=False)
    add(buffer, "next1", start=2)
    add(buffer, "next2", start=2)
    return buffer, straggler


def test_capped_windowed_step_waits_for_its_expiring_straggler_not_the_next_batch() -> None:
    buffer, straggler = capped_picture_buffer()
    uncapped = WindowedSampler(capped_picture_buffer()[0], max_staleness_versions=1, sample_freshest_first=False)
    assert names(select(uncapped, 2, max_groups=2)) == ["own1", "next1"]  # the spec's rule: any in-window group
    capped = WindowedSampler(buffer, max_staleness_versions=1, sample_freshest_first=True, over_sampling_ratio=1)
    assert names(select(capped, 2, max_groups=2)) == ["own1"]  # the straggler can still fill the step
    assert select(capped, 2, max_groups=1) is None  # so the step waits for it, not for the next batch
    asyncio.run(buffer.commit(straggler, scored("own2"), start_weight=1, end_weight=2))
    assert names(select(capped, 2, max_groups=1)) == ["own2"]
    assert names(select(capped, 3, max_groups=2)) == ["next1", "next2"]  # the next step finds its batch whole


def test_capped_windowed_step_takes_newer_groups_only_for_what_expiring_ones_lack() -> None:
    buffer, straggler = capped_picture_buffer()
    capped = WindowedSampler(buffer, max_staleness_versions=1, sample_freshest_first=False, over_sampling_ratio=1)
    assert names(select(capped, 2, max_groups=3)) == ["own1", "next1"]  # 3 needed, 2 expiring: one newer
    buffer.remove_group(straggler)  # the straggler failed (its slot goes): nothing expiring is left
    assert names(select(capped, 2, max_groups=1)) == ["next2"]
    early = new_buffer()  # before the window's end nothing expires: any in-window group, as uncapped
    add(early, "a", start=0, ready=False)
    add(early, "b", start=0)
    assert names(
        select(
            WindowedSampler(early, max_staleness_versions=1, sample_freshest_first=False, over_sampling_ratio=1),
            0,
            max_groups=2,
        )
    ) == ["b"]


def test_dispatch_cursor_resumes_exactly() -> None:
    sampler = InOrderSampler(new_buffer(), gate_window=1)
    sampler.restore_dispatch_index(4)  # batches 0..4 were admitted before the restart
    assert not sampler.can_admit(3) and sampler.can_admit(4)
    assert sampler.admit() == 5
    with pytest.raises(SamplerError, match=">= -1"):
        sampler.restore_dispatch_index(-2)


def test_in_order_never_selects_another_step_and_evicts_on_target() -> None:
    buffer = new_buffer()
    sampler = InOrderSampler(buffer, gate_window=1)
    add(buffer, "old", start=0, target=0)
    add(buffer, "now", start=0, target=1)  # an old weight but this step's stamp: kept and trained
    add(buffer, "late", start=1, target=0, ready=False)  # unready: never evicted under a running commit
    add(buffer, "next", start=1, target=2)
    assert names(evict(sampler, 1)) == ["old"]
    assert names(select(sampler, 1)) == ["now"]
    assert select(sampler, 1) is None
    assert [s.prompt_id for s in buffer.slots] == ["late", "next"]


def test_weight_fifo_waits_for_the_oldest_weight_instead_of_skipping_ahead() -> None:
    buffer = new_buffer()
    sampler = WeightFifoSampler(buffer, gate_window=1)
    add(buffer, "w0-running", start=0, ready=False)
    add(buffer, "w0-done", start=0)
    add(buffer, "w1-done", start=1)
    assert names(select(sampler, 1, min_groups=2, max_groups=2)) == []  # None: weight 0's batch is not full
    assert names(select(sampler, 1, min_groups=1, max_groups=2)) == ["w0-done"]  # never w1 while w0 is open
    assert names(evict(sampler, 2)) == []  # w1 is in [1, 2]; w0-running is unready
    assert names(evict(sampler, 3)) == ["w1-done"]


def test_weight_fifo_moves_on_once_a_short_oldest_weight_has_nothing_in_flight() -> None:
    # a resumed batch whose sealed generations kept weight 1 for three of its groups; the others restarted at 2
    buffer = new_buffer()
    sampler = WeightFifoSampler(buffer, gate_window=1)
    for name in ("a", "b", "c"):
        add(buffer, f"w1-{name}", start=1)
    for name in ("d", "e", "f", "g", "h"):
        add(buffer, f"w2-{name}", start=2)
    assert names(select(sampler, 2, min_groups=4, max_groups=4)) == ["w1-a", "w1-b", "w1-c", "w2-d"]
    assert names(select(sampler, 2, min_groups=4, max_groups=4)) == ["w2-e", "w2-f", "w2-g", "w2-h"]


@settings(max_examples=200, deadline=None)
@given(
    slots=st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=12),
    version=st.integers(0, 4),
    window=st.integers(0, 2),
    min_groups=st.integers(1, 4),
)
def test_weight_fifo_never_skips_an_unfinished_weight_and_never_waits_in_vain(
    slots: list[tuple[int, bool]], version: int, window: int, min_groups: int
) -> None:
    buffer = new_buffer()
    sampler = WeightFifoSampler(buffer, gate_window=window)
    for index, (weight, ready) in enumerate(sorted(slots, key=lambda slot: slot[0])):  # dispatch order
        add(buffer, f"{index}", start=weight, ready=ready)
    oldest = max(0, version - window)
    in_window = [(w, ready) for w, ready in slots if oldest <= w <= version]
    chosen = select(sampler, version, min_groups=min_groups, max_groups=8)
    weight_of = {f"{i}": w for i, (w, _) in enumerate(sorted(slots, key=lambda slot: slot[0]))}
    unfinished = [w for w, ready in in_window if not ready]
    for name in names(chosen):
        assert oldest <= weight_of[name] <= version
        assert not unfinished or weight_of[name] <= min(unfinished), "a newer weight while an older one generates"
    if not unfinished and len(in_window) >= min_groups:
        assert chosen, "every in-window group is ready and enough of them: waiting would never end"


def test_ready_first_never_evicts_and_never_takes_a_newer_weight() -> None:
    buffer = new_buffer()
    sampler = ReadyFirstSampler(buffer, gate_window=1)
    add(buffer, "ancient", start=0)
    add(buffer, "future", start=5)
    assert evict(sampler, 4) == []
    assert names(select(sampler, 4)) == ["ancient"]
    assert not sampler.is_on_policy


def test_windowed_evicts_outside_the_window_and_aborts_doomed_inflight() -> None:
    buffer = new_buffer()
    sampler = WindowedSampler(buffer, max_staleness_versions=1, sample_freshest_first=False)
    add(buffer, "w0", start=0)
    add(buffer, "w1", start=1)
    add(buffer, "w2", start=2)
    assert names(evict(sampler, 2)) == ["w0"]
    assert names(select(sampler, 2)) == ["w1", "w2"]
    assert sampler.should_abort_inflight(start_weight=0, trainer_version=2)
    assert not sampler.should_abort_inflight(start_weight=1, trainer_version=2)
    assert not InOrderSampler(new_buffer(), gate_window=0).should_abort_inflight(start_weight=0, trainer_version=9)


def test_freshest_first_breaks_ties_in_dispatch_order() -> None:
    buffer = new_buffer()
    sampler = WindowedSampler(buffer, max_staleness_versions=3, sample_freshest_first=True)
    for name, start in [("a1", 1), ("b3", 3), ("c2", 2), ("d3", 3), ("e1", 1)]:
        add(buffer, name, start=start)
    assert names(select(sampler, 3, max_groups=5)) == ["b3", "d3", "c2", "a1", "e1"]


def test_min_and_max_groups() -> None:
    buffer = new_buffer()
    sampler = ReadyFirstSampler(buffer, gate_window=0)
    for i in range(5):
        add(buffer, f"g{i}", start=0)
    assert select(sampler, 0, min_groups=6, max_groups=8) is None  # greedy but never below min
    assert names(select(sampler, 0, min_groups=2, max_groups=3)) == ["g0", "g1", "g2"]
    assert names(select(sampler, 0, min_groups=1, max_groups=8)) == ["g3", "g4"]
    with pytest.raises(SamplerError, match="min_groups must be >= 1"):
        select(sampler, 0, min_groups=0)
    with pytest.raises(SamplerError, match=r"max_groups \(1\) must be >= min_groups \(2\)"):
        select(sampler, 0, min_groups=2, max_groups=1)


def test_on_policy_flags() -> None:
    assert InOrderSampler(new_buffer(), gate_window=0).is_on_policy
    assert not InOrderSampler(new_buffer(), gate_window=1).is_on_policy
    assert WindowedSampler(new_buffer(), max_staleness_versions=0, sample_freshest_first=False).is_on_policy


def test_create_sampler_from_config() -> None:
    buffer = new_buffer()
    sampler = create_sampler(buffer, cfg.InOrderSamplerConfig(max_lookahead_versions=0, warmup_lookahead_versions=2))
    assert isinstance(sampler, InOrderSampler) and sampler.required_buffer_capacity(4) == 12
    windowed = create_sampler(buffer, cfg.WindowedSamplerConfig(max_staleness_versions=2, sample_freshest_first=True))
    assert isinstance(windowed, WindowedSampler) and windowed.sample_freshest_first
    assert windowed.batches_ahead is None  # uncapped by default
    capped = create_sampler(buffer, cfg.WindowedSamplerConfig(max_staleness_versions=2, over_sampling_ratio=1.5))
    assert capped.batches_ahead == 4  # floor(1.5 x 3)


def test_custom_sampler_gets_kwargs_and_is_type_checked() -> None:
    buffer = new_buffer()
    custom = cfg.CustomSamplerConfig(target="tests.controller.custom:LatestOnly", init_args={"keep": 3})
    sampler = create_sampler(buffer, custom)
    assert sampler.keep == 3 and sampler.buffer is buffer
    broken = cfg.CustomSamplerConfig(target="tests.config.custom_samplers:CapableSampler")
    with pytest.raises(SamplerError, match="cannot build it"):
        create_sampler(buffer, broken)
    incomplete = cfg.CustomSamplerConfig(target="tests.controller.custom:Incomplete")
    with pytest.raises(SamplerError, match="lacks .*can_admit, admit, select, evict"):
        create_sampler(buffer, incomplete)
