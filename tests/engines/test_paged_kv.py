"""The paged KV cache's block pool and tables: every block held by the rows that count it, tables mirrored on the
device, positions mapped into their rows' own blocks, shared blocks returned with their last holder."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sc_lightning.engines.megatron.paged_kv import PAGE, SCRATCH, PagedKVCache, blocks_for

pytestmark = pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning")
ROWS, BLOCKS, MAX_POSITIONS = 4, 9, 5 * PAGE


def cache() -> PagedKVCache:
    """A small paged cache on the CPU: 4 rows of up to 320 positions over 8 usable blocks."""
    return PagedKVCache(
        layers=1,
        blocks=BLOCKS,
        groups=1,
        head_dim=2,
        max_rows=ROWS,
        max_positions=MAX_POSITIONS,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )


class PoolMachine(RuleBasedStateMachine):
    """Random reserves, shares, releases and moves against a model of who holds what."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = cache()
        self.positions = [0] * ROWS  # what each row reserved (its own or shared)

    @rule(row=st.integers(0, ROWS - 1), positions=st.integers(1, MAX_POSITIONS))
    def reserve(self, row: int, positions: int) -> None:
        before = self.cache.blocks_of(row)
        free = self.cache.free_blocks
        ok = self.cache.reserve(row, positions)
        need = max(0, blocks_for(positions) - len(before))
        assert ok == (need <= free)
        if ok:
            assert self.cache.blocks_of(row)[: len(before)] == before  # growing keeps what the row had
            self.positions[row] = max(self.positions[row], positions)
        else:
            assert self.cache.blocks_of(row) == before and self.cache.free_blocks == free  # all or nothing

    @precondition(lambda self: any(self.positions))
    @rule(data=st.data())
    def share(self, data: st.DataObject) -> None:
        sources = [r for r in range(ROWS) if self.positions[r]]
        targets = [r for r in range(ROWS) if not self.cache.blocks_of(r)]
        if not targets:
            return
        source, target = data.draw(st.sampled_from(sources)), data.draw(st.sampled_from(targets))
        positions = data.draw(st.integers(0, self.positions[source]))
        free = self.cache.free_blocks
        held = self.cache.share(source, target, positions)
        full = positions // PAGE
        copied = positions % PAGE > 0 and free > 0  # the partial block copied into one of the target's own
        assert held == (positions if copied else full * PAGE)
        assert self.cache.blocks_of(target)[:full] == self.cache.blocks_of(source)[:full]
        assert len(self.cache.blocks_of(target)) == full + copied and self.cache.free_blocks == free - copied
        self.positions[target] = held

    @rule(row=st.integers(0, ROWS - 1))
    def release(self, row: int) -> None:
        self.cache.release(row)
        self.positions[row] = 0

    @rule(source=st.integers(0, ROWS - 1), to=st.integers(0, ROWS - 1))
    def move(self, source: int, to: int) -> None:
        if self.cache.blocks_of(to) and source != to:
            return
        blocks = self.cache.blocks_of(source)
        self.cache.move(source, to)
        assert self.cache.blocks_of(to) == blocks
        if source != to:
            assert self.cache.blocks_of(source) == []
            self.positions[to], self.positions[source] = self.positions[source], 0

    @invariant()
    def every_block_is_free_or_held_and_tables_mirror_the_rows(self) -> None:
        held = [block for row in range(ROWS) for block in self.cache.blocks_of(row)]
        assert SCRATCH not in held
        distinct = set(held)
        assert len(distinct) + self.cache.free_blocks == BLOCKS - 1  # nothing lost, nothing handed out twice
        for row in range(ROWS):
            blocks = self.cache.blocks_of(row)
            expected = blocks + [SCRATCH] * (self.cache.max_blocks - len(blocks))
            assert self.cache.tables[row].tolist() == expected


TestPool = PoolMachine.TestCase
TestPool.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_positions_map_into_their_rows_blocks_and_a_shared_prompt_is_read_not_rewritten() -> None:
    """Two rows of one prompt: the second shares the first's full prompt blocks, takes a copy of its partial one and
    writes only past the prompt; what each wrote through flat_index reads back through its own table; unreserved
    positions land in the scratch block."""
    kv = cache()
    assert kv.reserve(0, 150)  # a 150-token prompt: blocks for 0..149
    positions = torch.arange(150)[None]
    kv.flat(0)[kv.flat_index(torch.tensor([0]), positions)] = positions.flatten().float()[:, None, None, None]
    assert kv.share(0, 1, 149) == 149  # the two full blocks shared, positions 128..148 copied into its own block
    assert kv.blocks_of(1)[:2] == kv.blocks_of(0)[:2] and kv.blocks_of(1)[2] != kv.blocks_of(0)[2]
    assert kv.reserve(1, 200)
    mine = torch.arange(149, 200)[None]
    kv.flat(0)[kv.flat_index(torch.tensor([1]), mine)] = -mine.flatten().float()[:, None, None, None]
    first = kv.flat(0)[kv.flat_index(torch.tensor([0]), positions)][:, 0, 0, 0]
    second = kv.flat(0)[kv.flat_index(torch.tensor([1]), torch.arange(200)[None])][:, 0, 0, 0]
    assert torch.equal(first, torch.arange(150).float())  # the first row's K/V, untouched by the second
    assert torch.equal(second[:149], torch.arange(149).float()) and torch.equal(
        second[149:], -torch.arange(149, 200).float()
    )
    assert set(kv.flat_index(torch.tensor([2]), torch.arange(3)[None]).tolist()) <= set(range(PAGE))  # scratch
    kv.release(0)
    assert kv.free_blocks == BLOCKS - 1 - 4  # the shared blocks stay with the second row: 2 shared + 2 of its own
    kv.release(1)
    assert kv.free_blocks == BLOCKS - 1
    assert kv.reserve(0, MAX_POSITIONS) and kv.reserve(2, 3 * PAGE) and kv.free_blocks == 0  # a dry pool
    assert kv.share(0, 1, 100) == PAGE  # the full block shared, the partial one left to prefill


def test_the_forward_on_a_paged_cache_equals_the_forward_on_slots(model_parallel: None) -> None:
    """Two rows prefilled in chunks (one sharing the other's prompt blocks), then decoding together: the logits on a
    paged cache (blocks taken as the rows grow, scattered over the pool) equal those on the slot cache."""
    from sc_lightning.engines.megatron.cached_forward import CachedForward
    from sc_lightning.models import load_policy

    model = load_policy("builtin:tiny")[0].eval()
    forward = CachedForward(model, 256)
    slots, paged = forward.new_cache(2, 256), forward.new_paged_cache(blocks=12, max_rows=2, max_positions=256)
    assert paged.reserve(1, 1) and paged.reserve(0, 1)  # row 1 takes the lowest block first: row 0's are scattered
    prompt = [3 + i % 11 for i in range(140)]
    feeds = [  # (rows' slots, tokens, positions) of each call, as the batch feeds them
        ([0], [prompt[:70]], [list(range(70))]),
        ([0], [prompt[70:139]], [list(range(70, 139))]),
    ]
    outputs = {}
    with torch.inference_mode():
        for name, kv in (("slots", slots), ("paged", paged)):
            logits = []
            for rows, tokens, positions in feeds:
                if kv is paged:
                    assert kv.reserve(rows[0], positions[0][-1] + 1)
                ids, where = torch.tensor(tokens), torch.tensor(positions)
                forward(kv, ids, where, kv_len=where.max().item() + 1, slots=torch.tensor(rows), logits=False)
            # row 1 has the same prompt: the slot cache copies it; the paged one shares the two full blocks and
            # copies the last 11 prompt positions into a block of its own
            if kv is paged:
                kv.release(1)
                assert kv.share(0, 1, 139) == 139 and kv.reserve(1, 141) and kv.reserve(0, 141)
            else:
                kv.move(0, 1, 139)
            for step in range(2):  # both rows decode: the prompt's last token, then one more
                ids = torch.tensor([[prompt[139] if step == 0 else 5], [prompt[139] if step == 0 else 7]])
                where = torch.full((2, 1), 139 + step)
                logits.append(forward(kv, ids, where, kv_len=140 + step))
            outputs[name] = torch.stack(logits)
    torch.testing.assert_close(outputs["paged"], outputs["slots"], rtol=1e-5, atol=1e-5)


def test_an_engine_on_a_paged_cache_samples_as_on_slots_and_a_short_pool_preempts(model_parallel: None) -> None:
    """Prompt groups and lone prompts, greedy and seeded: a paged engine gives the very tokens and logprobs of a slot
    engine; with a pool far smaller than its rows need, it preempts rows (they prefill again later) and still gives
    them."""
    import asyncio

    from sc_lightning.engines.megatron.engine import MegatronEngine
    from sc_lightning.types import SamplingParams

    prompts = [tuple(3 + (i * 7 + j) % 13 for j in range(10 + 40 * (i % 3))) for i in range(3)]
    calls = [(p, SamplingParams(90, temperature=0.0)) for p in prompts]
    calls += [(prompts[2], SamplingParams(90, temperature=0.9, seed=s)) for s in range(4)]  # a 90-token group

    def run(**layout: object) -> tuple[list, dict]:
        engine = MegatronEngine.from_pretrained("builtin:tiny", stop_on_eos=False, max_batch_size=8, **layout)

        async def scenario() -> list:
            try:
                return list(await asyncio.gather(*(engine.generate(p, s) for p, s in calls)))
            finally:
                await engine.shutdown()

        return asyncio.run(scenario()), vars(engine.stats)

    slots, slot_stats = run()
    paged, paged_stats = run(kv_cache_layout="paged")
    short, short_stats = run(kv_cache_layout="paged", kv_cache_blocks=1 + 8)  # 512 positions for 7 rows of ~150
    for a, b, c in zip(slots, paged, short, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids and len(a.token_ids) == 90
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(c.logprobs), atol=1e-5)
    assert paged_stats["copied_positions"] > 0  # the group shared its prompt's full blocks
    assert short_stats["decode_steps"] > paged_stats["decode_steps"]  # preempted rows decoded again later
    assert short_stats["preemptions"] > 0 == paged_stats["preemptions"] == slot_stats["preemptions"]


def test_rows_prefilling_in_chunks_through_a_small_pool_give_the_slot_engines_tokens(model_parallel: None) -> None:
    """Six 100-token prompts prefilled 32 tokens a step through a pool of four blocks (two rows' worth): rows take
    turns, the newest stepping aside, and every completion is the slot engine's."""
    import asyncio

    from sc_lightning.engines.megatron.engine import MegatronEngine
    from sc_lightning.types import SamplingParams

    prompts = [tuple(3 + (i + j) % 13 for j in range(100)) for i in range(6)]

    def run(**layout: object) -> list:
        engine = MegatronEngine.from_pretrained(
            "builtin:tiny", stop_on_eos=False, max_batch_size=6, prefill_chunk_tokens=32, **layout
        )

        async def scenario() -> list:
            try:
                calls = [engine.generate(p, SamplingParams(20, temperature=0.0)) for p in prompts]
                return list(await asyncio.wait_for(asyncio.gather(*calls), 120))
            finally:
                await engine.shutdown()

        return asyncio.run(scenario())

    slots, paged = run(), run(kv_cache_layout="paged", kv_cache_blocks=1 + 4)
    assert [g.token_ids for g in paged] == [g.token_ids for g in slots]
    assert all(len(g.token_ids) == 20 for g in paged)


def test_when_no_row_decodes_and_none_can_prefill_the_newest_row_makes_room(model_parallel: None) -> None:
    """A dry pool held by rows that all still wait for their prompts (none decodes, so none will free a block): the
    newest row leaves for the queue, and the oldest goes on."""
    from sc_lightning.models import load_policy
    from tests.engines.helpers import batch_on, request

    model = load_policy("builtin:tiny")[0].eval()
    batch = batch_on(model, max_rows=3, buckets=False, kv_layout="paged", kv_blocks=1 + 2)
    first, second = request(tuple(3 + j % 13 for j in range(100))), request(tuple(4 + j % 11 for j in range(100)))
    batch.add(first)
    batch.add(second)
    with torch.inference_mode():
        batch.step(0)  # the first row prefills 64 positions: its first block
        assert batch.kv.reserve(1, 1)  # the second takes the last block (as a chunk of its own would have)
        batch.step(0)  # the first row needs a second block: none is free, and no row decodes
        assert batch.returned == [second] and [row.request for row in batch.rows] == [first]
        while batch.rows:
            batch.step(0)
    assert len(first.tokens) == 12


def test_a_request_a_paged_pool_cannot_hold_even_alone_fails_naming_the_knobs(model_parallel: None) -> None:
    """One block (64 positions) for a 100-token prompt: the request fails with an error saying what to change,
    instead of stepping aside and coming back forever."""
    import asyncio

    from sc_lightning.engines.base import EngineError
    from sc_lightning.engines.megatron.engine import MegatronEngine
    from sc_lightning.types import SamplingParams

    engine = MegatronEngine.from_pretrained(
        "builtin:tiny", stop_on_eos=False, kv_cache_layout="paged", kv_cache_blocks=1 + 1, prefill_chunk_tokens=32
    )

    async def scenario() -> None:
        try:
            with pytest.raises(EngineError, match=r"request req-\d+: .*cannot hold .*kv_cache_memory_fraction"):
                await asyncio.wait_for(engine.generate(tuple([3] * 100), SamplingParams(4)), 60)
        finally:
            await engine.shutdown()

    asyncio.run(scenario())
