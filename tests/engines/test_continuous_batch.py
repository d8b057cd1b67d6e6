"""Continuous batching in the Megatron engine: requests join and leave at every step, prefill goes in chunks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from sc_lightning.engines.megatron.cached_forward import CachedForward, _fused_kernels
from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.engines.megatron.request import Request
from sc_lightning.models import load_policy
from sc_lightning.types import SamplingParams
from tests.engines.helpers import GREEDY, WorkerGate, batch_on, follows_argmax, request

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]


def test_a_request_arriving_mid_run_finishes_before_the_long_one_it_joined(tiny_dirs: dict) -> None:
    async def scenario() -> tuple:
        engine = MegatronEngine.from_pretrained(str(tiny_dirs["a"]), stop_on_eos=False)
        gate = WorkerGate(engine, 5)  # the short request joins after the long one's fifth token
        long = asyncio.create_task(engine.generate((4, 5, 6), SamplingParams(200, temperature=0.0)))
        short = await (await gate.during(engine.generate((7, 8), SamplingParams(4, temperature=0.0))))
        result = await long
        stats = engine.stats
        await engine.shutdown()
        return short, result, stats

    short, result, stats = asyncio.run(scenario())
    assert len(short.token_ids) == 4
    # one run of 200 decode steps: the short request's 4 tokens rode the long one's steps, started and ended within
    assert stats.batches == 1 and stats.decode_steps == 200
    model = load_policy(str(tiny_dirs["a"]))[0].eval()
    assert all(follows_argmax(model, (7, 8), short.token_ids))
    assert all(follows_argmax(model, (4, 5, 6), result.token_ids)) and len(result.token_ids) == 200


def test_prefill_in_small_chunks_gives_the_same_tokens(tiny_dirs: dict) -> None:
    prompts = [tuple(3 + (i * 5 + j) % 15 for j in range(1 + 9 * i)) for i in range(5)]  # 1 to 37 tokens
    settings = [GREEDY if i % 2 else SamplingParams(12, temperature=0.9, top_k=8, seed=i) for i in range(5)]

    async def scenario(chunk: int) -> tuple:
        engine = MegatronEngine.from_pretrained(str(tiny_dirs["a"]), stop_on_eos=False, prefill_chunk_tokens=chunk)
        try:
            out = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, settings, strict=True)))
            return out, engine.stats.prefill_chunks
        finally:
            await engine.shutdown()

    (small, small_chunks), (whole, whole_chunks) = asyncio.run(scenario(4)), asyncio.run(scenario(1024))
    assert small_chunks > whole_chunks
    for a, b in zip(small, whole, strict=True):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_a_long_prompt_prefills_in_chunks_while_running_rows_keep_decoding() -> None:
    model = load_policy("builtin:tiny")[0].eval()
    batch = batch_on(model, prefill_tokens=4, buckets=False)
    running, long = request((3, 4), SamplingParams(30, temperature=0.0)), request(tuple([5, 6, 7, 8] * 10))
    batch.add(running)
    with torch.inference_mode():
        batch.step(0)
        batch.add(long)
        for chunk in range(1, 11):  # 39 positions to prefill, 4 a step; the 40th (last) token is fed by decode
            batch.step(0)
            assert len(running.tokens) == 1 + chunk  # one token every step, the prefill notwithstanding
            assert len(long.tokens) == (1 if chunk == 10 else 0)
    assert batch.prefill_calls == 1 + 10  # the running row's prompt, then the long one's ten chunks
    assert all(follows_argmax(model, long.prompt, tuple(long.tokens)))


@pytest.mark.parametrize(
    ("buckets", "overlap"), [(False, False), (True, False), (True, True)], ids=["exact", "graph-buckets", "overlap"]
)
def test_rows_join_and_leave_every_step_and_stay_exact(buckets: bool, overlap: bool) -> None:
    """As on a GPU: padded batches and KV spans, and (overlap) each step queued before the previous one is read."""
    model = load_policy("builtin:tiny")[0].eval()
    batch = batch_on(model, max_rows=3, prefill_tokens=8, buckets=buckets, overlap=overlap)
    prompts = [tuple(3 + (i + j) % 15 for j in range(2 + 5 * i)) for i in range(6)]  # 2 to 27 tokens
    queue = [request(p, SamplingParams(4 + 5 * i, temperature=0.0)) for i, p in enumerate(prompts)]
    queue[3].stop_ids = frozenset({2})  # may end early, at a step the host cannot foresee
    done: list[Request] = []
    with torch.inference_mode():
        while queue or batch.rows:
            while queue and len(batch.rows) < 3:
                batch.add(queue.pop(0))
            done += [finished for finished, _ in batch.step(0)]
        assert not batch.drain(0)
    assert len(done) == 6  # slots were freed and reused: three at a time, six requests
    for finished in done:
        stopped = finished.tokens[-1] in finished.stop_ids
        assert stopped or len(finished.tokens) == finished.sampling.max_new_tokens
        assert all(follows_argmax(model, finished.prompt, tuple(finished.tokens))), finished.prompt
    assert batch.decode_steps < sum(len(r.tokens) for r in done)  # rows shared decode steps


def test_the_fused_decode_path_is_gpu_only_and_refuses_flash(tiny_dirs: dict) -> None:
    model, _, _ = load_policy(str(tiny_dirs["a"]))
    assert CachedForward(model, 256, fused_decode=True).kernels is None  # on the CPU: the plain torch forward
    assert CachedForward(model, 256).kernels is None  # the default too
    with pytest.raises(ValueError, match="flash_decode"):
        _fused_kernels(model, True, True, True)  # asked for on a GPU, with flash
    assert _fused_kernels(model, True, None, True) is None  # by default flash_decode wins, silently
    assert _fused_kernels(model, True, False, False) is None  # turned off on a GPU
