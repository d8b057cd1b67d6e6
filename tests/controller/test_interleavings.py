"""Random interleavings of dispatch / commit / fail / train / refit against the real buffer, samplers and permits.

Hypothesis drives a small model of the two pumps: the rollout side admits batches through the sampler, reserves
slots under buffer permits and commits or fails them in any order; the train side evicts and selects chunks,
and refits when a step is complete (aborting rollouts the sampler says are doomed). After every operation:
every buffered slot holds exactly one permit, no group is selected twice, every committed group is selected,
evicted or still buffered, in_order trains only on a group's target step, staleness stays in the window, and a
capped windowed sampler never has more batches admitted ahead of the trainer than its over_sampling_ratio allows.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.controller.permits import Permits
from sc_lightning.controller.samplers import (
    InOrderSampler,
    ReadyFirstSampler,
    WeightFifoSampler,
    WindowedSampler,
)
from tests.controller.helpers import new_buffer, scored

N = 2  # groups per step


@dataclass
class Model:
    """The state of one interleaving."""

    sampler: object
    window: int
    permits: Permits
    version: int = 0
    engine_version: int = 0
    batch_left: int = 0
    batch_target: int | None = None
    pending: list[str] = field(default_factory=list)
    committed: set[str] = field(default_factory=set)
    selected: set[str] = field(default_factory=set)
    evicted: set[str] = field(default_factory=set)
    step_groups: int = 0

    @property
    def buffer(self):
        return self.sampler.buffer

    def dispatch(self) -> None:
        if self.permits.held == self.permits.total:
            return  # the pump would block on a buffer permit
        if self.batch_left == 0:
            if not self.sampler.can_admit(self.version):
                return  # the pump would wait for the trainer
            self.batch_target, self.batch_left = self.sampler.admit(), N
        asyncio.run(self.permits.acquire())
        group_id = self.buffer.reserve(
            prompt_id=f"p{len(self.committed) + len(self.pending)}",
            weight_version=self.engine_version,
            target_step=self.batch_target,
        )
        self.pending.append(group_id)
        self.batch_left -= 1

    def finish(self, index: int, ok: bool) -> None:
        if not self.pending:
            return
        group_id = self.pending.pop(index % len(self.pending))
        if ok:
            start = self.buffer.slots[self.buffer.index_of(group_id)].start_weight
            asyncio.run(
                self.buffer.commit(group_id, scored(group_id), start_weight=start, end_weight=self.engine_version)
            )
            self.committed.add(group_id)
        else:  # a failed rollout removes its slot and frees its permit
            self.buffer.remove_group(group_id)
            self.permits.release()

    def train(self, max_chunk: int) -> None:
        evicted = asyncio.run(self.sampler.evict(trainer_version=self.version))
        self.permits.release(len(evicted))
        self.evicted |= {g.group_id for g in evicted}
        room = N - self.step_groups
        chunk = asyncio.run(
            self.sampler.select(trainer_version=self.version, min_groups=1, max_groups=min(max_chunk, room))
        )
        for group in chunk or []:
            assert group.group_id not in self.selected, "a group was selected twice"
            if isinstance(self.sampler, InOrderSampler):
                assert group.target_step == self.version, "in_order trained a group on another step"
            if isinstance(self.sampler, WindowedSampler | WeightFifoSampler):
                assert 0 <= self.version - group.start_weight <= self.window, "staleness beyond the window"
            self.selected.add(group.group_id)
        self.permits.release(len(chunk or []))
        self.step_groups += len(chunk or [])
        if self.step_groups == N:
            self.refit()

    def refit(self) -> None:
        self.version += 1
        self.step_groups = 0
        for group_id in list(self.pending):
            start = self.buffer.slots[self.buffer.index_of(group_id)].start_weight
            if self.sampler.should_abort_inflight(start_weight=start, trainer_version=self.version):
                self.pending.remove(group_id)
                self.buffer.remove_group(group_id)
                self.permits.release()
        self.engine_version = self.version

    def check(self) -> None:
        assert self.permits.held == len(self.buffer), "every buffered slot holds exactly one permit"
        cap = getattr(self.sampler, "batches_ahead", None)
        if cap is not None:  # windowed's over_sampling_ratio: never more batches admitted ahead of the trainer
            assert self.sampler.dispatch_index + 1 - self.version <= cap, "dispatched past the over-sampling cap"
        buffered_ready = {m.group_id for m in self.buffer.ready_metas()}
        assert self.committed == self.selected | self.evicted | buffered_ready, "a committed group went missing"
        assert not (self.selected & self.evicted) and not (self.selected & buffered_ready)


SAMPLERS = {
    "in_order": lambda b, w: InOrderSampler(b, gate_window=w),
    "weight_fifo": lambda b, w: WeightFifoSampler(b, gate_window=w),
    "ready_first": lambda b, w: ReadyFirstSampler(b, gate_window=w),
    "windowed": lambda b, w: WindowedSampler(b, max_staleness_versions=w, sample_freshest_first=False),
    "windowed_freshest": lambda b, w: WindowedSampler(b, max_staleness_versions=w, sample_freshest_first=True),
    "windowed_capped": lambda b, w: WindowedSampler(
        b, max_staleness_versions=w, sample_freshest_first=False, over_sampling_ratio=1.5
    ),
}

operation = st.one_of(
    st.just(("dispatch",)),
    st.tuples(st.just("commit"), st.integers(0, 50)),
    st.tuples(st.just("fail"), st.integers(0, 50)),
    st.tuples(st.just("train"), st.integers(1, N)),
)


@settings(max_examples=150, deadline=None)
@given(
    mode=st.sampled_from(sorted(SAMPLERS)),
    window=st.integers(0, 2),
    extra_capacity=st.integers(0, 4),
    operations=st.lists(operation, min_size=1, max_size=60),
)
def test_random_interleavings_keep_every_invariant(mode, window, extra_capacity, operations) -> None:
    buffer = new_buffer()
    sampler = SAMPLERS[mode](buffer, window)
    capacity = (sampler.required_buffer_capacity(N) or N) + extra_capacity
    model = Model(sampler, window, Permits(capacity, "max_buffered_rollouts"))
    for op in operations:
        if op[0] == "dispatch":
            model.dispatch()
        elif op[0] in ("commit", "fail"):
            model.finish(op[1], ok=op[0] == "commit")
        else:
            model.train(op[1])
        model.check()
