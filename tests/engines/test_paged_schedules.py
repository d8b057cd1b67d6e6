"""A paged continuous batch under any schedule gives the slot batch's tokens.

Hypothesis draws what a worker sees: requests joining (prompt groups among them, prompts across block boundaries),
steps, refits and stand-downs (applied outside inference mode, as the worker applies its commands), with and without
the overlapped decode step. A paged pool far smaller than its rows need preempts rows, which join again later. Both
batches run the same schedule; every request's greedy tokens must be the slot batch's and follow the model's argmax.
"""

from __future__ import annotations

from collections import deque
from functools import cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.engines.megatron.kv_rows import KVLayout
from sc_lightning.engines.megatron.request import Request
from sc_lightning.types import SamplingParams
from tests.engines.helpers import batch_on, follows_argmax, request

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]
PROMPTS = [tuple(3 + (i * 5 + j) % 13 for j in range(length)) for i, length in enumerate((7, 63, 64, 65, 130))]
MAX_TICKS = 2000  # worker iterations to finish every request: far more than the drawn work needs


@cache
def tiny_model() -> torch.nn.Module:
    """builtin:tiny, built once per worker process."""
    from sc_lightning.models import load_policy

    return load_policy("builtin:tiny")[0].eval()


class Worker:
    """Drives a batch as the engine's worker thread does: fills it from a queue, steps it, requeues what it returned,
    and applies refits and stand-downs between steps (after reading a step in flight)."""

    def __init__(self, layout: KVLayout, overlap: bool) -> None:
        self.batch = batch_on(
            tiny_model(),
            max_rows=4,
            prefill_tokens=48,
            buckets=False,
            overlap=overlap,
            kv_layout=layout,
            kv_blocks=1 + 5 if layout == "paged" else None,  # 320 positions for 4 rows of up to 146
        )
        self.pending: deque[Request] = deque()

    def tick(self) -> None:
        """One worker iteration: admit what fits, step, put the rows the batch sent back at the queue's head."""
        while self.pending and len(self.batch.rows) < self.batch.capacity:
            self.batch.add(self.pending.popleft())
        if self.batch.rows:
            with torch.inference_mode():
                self.batch.step(0)
            self.pending.extendleft(reversed(self.batch.returned))
            self.batch.returned = []

    def command(self, kind: str) -> None:
        """A refit (same weights: every row recomputes its K/V) or a stand-down (the cache freed)."""
        with torch.inference_mode():
            self.batch.drain(0)
        if kind == "refit":
            self.batch.weights_changed()
        else:
            self.batch.release()

    def busy(self) -> bool:
        return bool(self.pending or self.batch.rows)


operation = st.one_of(
    st.tuples(st.just("join"), st.integers(0, len(PROMPTS) - 1), st.integers(1, 16), st.integers(1, 3)),
    st.tuples(st.just("tick")),
    st.tuples(st.sampled_from(["refit", "stand_down"])),
)


@settings(max_examples=12, deadline=None)
@given(schedule=st.lists(operation, min_size=1, max_size=24), overlap=st.booleans())
def test_a_paged_batch_gives_the_slot_batchs_tokens_under_any_schedule(schedule: list, overlap: bool) -> None:
    layouts: tuple[KVLayout, ...] = ("slots", "paged")
    workers = {layout: Worker(layout, overlap) for layout in layouts}
    joined: dict[str, list[Request]] = {layout: [] for layout in workers}
    for op in schedule:
        for layout, worker in workers.items():
            if op[0] == "join":  # a prompt asked `count` times: a group shares (or copies) its prompt
                _, prompt, new, count = op
                for _ in range(count):
                    joined[layout].append(request(PROMPTS[prompt], SamplingParams(new, temperature=0.0)))
                    worker.pending.append(joined[layout][-1])
            elif op[0] == "tick":
                worker.tick()
            else:
                worker.command(op[0])
    for worker in workers.values():
        for _ in range(MAX_TICKS):
            if not worker.busy():
                break
            worker.tick()
        assert not worker.busy(), "the batch did not finish its requests"
    for slot, paged in zip(joined["slots"], joined["paged"], strict=True):
        assert paged.tokens == slot.tokens and len(paged.tokens) == paged.sampling.max_new_tokens
        assert all(follows_argmax(tiny_model(), paged.prompt, tuple(paged.tokens)))
