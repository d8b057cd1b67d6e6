"""The Megatron engine's KV cache sized from a memory budget: the arithmetic, and an engine that holds fewer rows.

Off CUDA no budget applies (the cache always has ``max_batch_size`` rows), so the engine tests stand a fake in for
the one GPU reading, ``kv_cache.free_device_bytes``: it reports as free exactly what a chosen number of rows needs.
tests/gpu/test_engine_gpu.py checks the same on a GPU with its real free memory.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.engines.base import EngineError
from sc_lightning.engines.megatron import kv_cache
from sc_lightning.engines.megatron.cached_forward import CachedForward
from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.engines.megatron.kv_cache import free_device_bytes, rows_within_budget
from sc_lightning.models import load_policy
from sc_lightning.types import SamplingParams
from tests.engines.helpers import follows_argmax

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]
KNOB = "policy.generation.mcore_generation_config.kv_cache_memory_fraction"


@given(
    free=st.integers(1, 10**12),
    fraction=st.floats(0.01, 1.0),
    row_bytes=st.integers(1, 10**10),
    max_rows=st.integers(1, 1024),
)
def test_the_rows_fill_the_budget_and_never_pass_it_or_max_rows(
    free: int, fraction: float, row_bytes: int, max_rows: int
) -> None:
    budget = int(free * fraction)
    if budget < row_bytes:
        with pytest.raises(ValueError, match=KNOB):
            rows_within_budget(free_bytes=free, fraction=fraction, row_bytes=row_bytes, max_rows=max_rows)
        return
    rows = rows_within_budget(free_bytes=free, fraction=fraction, row_bytes=row_bytes, max_rows=max_rows)
    assert 1 <= rows <= max_rows and rows * row_bytes <= budget
    assert rows == max_rows or (rows + 1) * row_bytes > budget  # as many as fit


def test_a_slot_takes_the_bytes_the_budget_counts_and_no_budget_applies_off_cuda() -> None:
    model = load_policy("builtin:tiny")[0].eval()
    forward = CachedForward(model, 256)
    for length in (1, 64, 100, 256):
        cache = forward.new_cache(3, length)
        assert forward.slot_bytes(length) * 3 == cache.tensor.nbytes
    assert free_device_bytes(torch.device("cpu")) is None


def _free_for(rows: int, fraction: float, model_name: str, length: int):  # noqa: ANN202
    """A stand-in for ``free_device_bytes`` reporting what ``rows`` cache rows need at ``fraction`` (a fake)."""
    forward = CachedForward(load_policy(model_name)[0].eval(), length)
    needed = -(-forward.slot_bytes(length) * rows * 100 // round(fraction * 100))
    return lambda device: needed


@pytest.mark.parametrize(("layout", "rows", "blocks"), [("slots", 2, None), ("paged", 4, 1 + 8)], ids=str)
def test_an_engine_whose_budget_holds_two_whole_contexts_runs_six_requests_exactly(
    monkeypatch, layout: str, rows: int, blocks: int | None
) -> None:
    """max_batch_size 4 admits four requests before the cache exists. Slots: the budget holds two rows, and the
    other two go back to the head of the queue with nothing lost. Paged: the same bytes are eight blocks of 64
    positions (plus the scratch block), and all four rows' short contexts fit at once. Either way all six come back
    whole and exact, and the shutdown frees the cache."""
    monkeypatch.setattr(kv_cache, "free_device_bytes", _free_for(2, 0.5, "builtin:tiny", 256))
    prompts = [tuple(3 + (i + j) % 15 for j in range(2 + 3 * i)) for i in range(6)]

    async def queued(engine: MegatronEngine, count: int) -> None:
        while len(engine._worker._pending) < count:
            await asyncio.sleep(0.001)

    async def scenario() -> tuple:
        engine = MegatronEngine.from_pretrained(
            "builtin:tiny",
            stop_on_eos=False,
            max_batch_size=4,
            max_seq_len=256,
            kv_cache_memory_fraction=0.5,
            kv_cache_layout=layout,
        )
        try:
            await engine.stand_down()  # all six wait, so that four join at once when it wakes
            sampling = SamplingParams(6, temperature=0.0)
            tasks = [asyncio.create_task(engine.generate(p, sampling)) for p in prompts]
            await asyncio.wait_for(queued(engine, 6), 30)
            await engine.wake()
            results = await asyncio.gather(*tasks)
            return results, engine._batch.cache, engine.stats, engine
        finally:
            await engine.shutdown()

    results, cache, stats, engine = asyncio.run(scenario())
    assert cache.slots == rows and (blocks is None or cache.tensor.size(1) == blocks)
    assert engine._batch.cache is None  # shut down: its memory is handed back at once, not when it is collected
    assert stats.finished_requests == 6 and stats.generated_tokens == 36
    model = load_policy("builtin:tiny")[0].eval()
    for prompt, result in zip(prompts, results, strict=True):
        assert result.finish_reason == "length" and len(result.token_ids) == 6
        assert all(follows_argmax(model, prompt, result.token_ids)), prompt


def test_a_budget_without_room_for_one_row_fails_the_request_naming_the_knob(monkeypatch) -> None:
    monkeypatch.setattr(kv_cache, "free_device_bytes", lambda device: 1024)

    async def scenario() -> None:
        engine = MegatronEngine.from_pretrained("builtin:tiny", max_seq_len=256, name="budget")
        try:
            await engine.generate((3, 4), SamplingParams(4, temperature=0.0))
        finally:
            await engine.shutdown()

    with pytest.raises(EngineError, match=rf"engine 'budget', request .*{KNOB}"):
        asyncio.run(scenario())


def test_the_fraction_must_be_in_zero_to_one() -> None:
    with pytest.raises(ValueError, match=r"kv_cache_memory_fraction must be in \(0, 1\], got 1.5"):
        MegatronEngine.from_pretrained("builtin:tiny", kv_cache_memory_fraction=1.5)
