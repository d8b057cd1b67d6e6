"""On one GPU: the Megatron engine (continuous batching, CUDA-graphed decode) agrees with full forwards of the model.

Greedy tokens equal a full forward's argmax and logprobs equal the trainer's ``token_logprobs``, with requests of
different prompt lengths joining mid-run and long prompts prefilled in chunks, through a weight update and a
stand-down (which frees the KV cache and the graphs), on either decode attention kernel. Run by
scripts/gpu_check.sh; deselected where no GPU exists.

Tolerances: fp32 1e-3 nats (the engine and the trainer use different attention kernels and GEMM shapes). bf16 0.1
nats: a bf16 logit of magnitude ~10 carries a rounding error of ~0.04, and the two paths round differently. A greedy
token may differ from the reference argmax only where the reference's own top two logits are within that tolerance.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.engines.megatron.kv_cache import free_device_bytes
from sc_lightning.engines.megatron.paged_kv import KVCache, PagedKVCache, blocks_for
from sc_lightning.models import build_gpt_model, export_hf_weights, logits_of, token_logprobs
from sc_lightning.models.convert import random_hf_state
from sc_lightning.models.spec import ModelSpec
from sc_lightning.types import Generation, SamplingParams

pytestmark = pytest.mark.gpu

SPEC = ModelSpec(  # GQA (4 query heads per KV group), head_dim 64, QKV bias, untied output layer
    vocab_size=512,
    hidden_size=512,
    num_layers=3,
    num_attention_heads=8,
    num_query_groups=2,
    ffn_hidden_size=1024,
    max_position_embeddings=512,
    qkv_bias=True,
)
TOLERANCE = {"fp32": 1e-3, "bf16": 0.1}  # nats
PROMPTS = [(5,), tuple(range(3, 8)), tuple(range(10, 27)), tuple(range(30, 70)), (9, 8, 7), tuple(range(100, 170))]


def weights(seed: int) -> dict[str, torch.Tensor]:
    """Seeded random HF weights whose logits are spread (a scaled output layer), so greedy choices are clear."""
    state = random_hf_state(SPEC, seed)
    state["lm_head.weight"] = state["lm_head.weight"] * 5.0
    return state


def replica(seed: int, precision: str) -> torch.nn.Module:
    """A model of SPEC with :func:`weights` of ``seed`` on the GPU."""
    return build_gpt_model(SPEC, precision=precision, hf_state=weights(seed), device="cuda").eval()


def engine_on_bf16(**kwargs: object) -> MegatronEngine:
    """An engine on a bf16 replica of seed 0's weights, eos ignored, with ``kwargs``."""
    return MegatronEngine(replica(0, "bf16"), SPEC, eos_token_id=None, stop_on_eos=False, **kwargs)


def check(ref: torch.nn.Module, prompt: tuple[int, ...], generation: Generation, precision: str) -> None:
    """Greedy tokens are the reference's argmax (up to near-ties) and logprobs its token_logprobs."""
    ids = torch.tensor([prompt + generation.token_ids], device="cuda")
    tol = TOLERANCE[precision]
    with torch.no_grad():
        logits = logits_of(ref, ids)[0, len(prompt) - 1 : -1].float()  # (new, vocab): the logits of each new token
        trainer = token_logprobs(ref, ids)[0, len(prompt) :].float().cpu()
    chosen = torch.tensor(generation.token_ids, device="cuda")
    gap = logits.max(-1).values - logits.gather(-1, chosen[:, None])[:, 0]  # 0 where the engine took the argmax
    assert bool((gap <= tol).all()), (prompt, generation.token_ids, gap.tolist())
    error = (trainer - torch.tensor(generation.logprobs)).abs().max()
    assert float(error) < tol, (prompt, float(error))


async def until_sampled(
    engine: MegatronEngine, tokens: int, requests: list[asyncio.Task], within_s: float = 120
) -> None:
    """Wait until ``engine`` has sampled ``tokens`` tokens in all; a request of ``requests`` that fails raises its
    error at once (it would never sample them), and so does a wait past ``within_s``."""
    deadline = time.monotonic() + within_s
    while engine.stats.generated_tokens < tokens:
        for request in requests:
            if request.done() and request.exception() is not None:
                raise request.exception()
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine {engine.name!r} sampled {engine.stats.generated_tokens} of {tokens} tokens")
        await asyncio.sleep(0.001)


async def generate_all(engine: MegatronEngine, new: int) -> list[Generation]:
    """Greedy completions of PROMPTS, the last two joining while the first ones decode."""
    greedy = SamplingParams(new, temperature=0.0)
    before = engine.stats.generated_tokens
    first = [asyncio.create_task(engine.generate(p, greedy)) for p in PROMPTS[:-2]]
    await until_sampled(engine, before + 8, first)
    late = [asyncio.create_task(engine.generate(p, greedy)) for p in PROMPTS[-2:]]
    return list(await asyncio.gather(*first, *late))


@pytest.mark.parametrize(
    ("precision", "flash", "fused"),
    [("fp32", False, False), ("bf16", False, False), ("bf16", True, False), ("bf16", False, True)],
    ids=["fp32", "bf16", "bf16-flash", "bf16-fused"],
)
def test_engine_matches_full_forwards_through_a_refit_and_a_stand_down(
    precision: str, flash: bool, fused: bool
) -> None:
    ref_a, ref_b = replica(0, precision), replica(1, precision)
    engine = MegatronEngine(
        replica(0, precision),
        SPEC,
        eos_token_id=None,
        stop_on_eos=False,
        max_batch_size=8,
        prefill_chunk_tokens=32,
        flash_decode=flash,
        fused_decode=fused,
    )
    sampled = SamplingParams(24, temperature=1.0, top_p=0.9, seed=3)

    async def scenario() -> tuple:
        on_a = await generate_all(engine, 24)
        drawn = await engine.generate(PROMPTS[2], sampled)
        await engine.update_weights(export_hf_weights(ref_b, SPEC), version=1)
        on_b = await generate_all(engine, 24)
        long = asyncio.create_task(engine.generate(PROMPTS[3], SamplingParams(300, temperature=0.0)))
        await until_sampled(engine, sum(len(g.token_ids) for g in on_a + on_b) + 25 + 20, [long])
        await engine.stand_down()
        captured_before = engine.stats.graph_captures
        await engine.wake()
        resumed = await long
        graphs = len(engine._batch.graphs)
        await engine.shutdown()
        return on_a, drawn, on_b, resumed, graphs, captured_before

    on_a, drawn, on_b, resumed, graphs, captured_before = asyncio.run(scenario())
    forward = engine._batch.forward  # graphed decode on flash attention or on the memory-efficient kernel
    assert graphs > 0 and forward.efficient and forward.flash == flash and (forward.kernels is not None) == fused
    # the stand-down freed the graphs: every graph held now was captured again after the wake, and counted
    assert captured_before > 0 and engine.stats.graph_captures == captured_before + graphs
    assert engine.stats.graph_capture_s > 0
    for prompt, generation in zip(PROMPTS, on_a, strict=True):
        assert generation.weight_version == 0 and len(generation.token_ids) == 24
        check(ref_a, prompt, generation, precision)
    ids = torch.tensor([PROMPTS[2] + drawn.token_ids], device="cuda")
    with torch.no_grad():
        trainer = token_logprobs(ref_a, ids)[0, len(PROMPTS[2]) :].float().cpu()
    assert float((trainer - torch.tensor(drawn.logprobs)).abs().max()) < TOLERANCE[precision]
    for prompt, generation in zip(PROMPTS, on_b, strict=True):
        assert generation.weight_version == 1
        check(ref_b, prompt, generation, precision)
    assert len(resumed.token_ids) == 300
    check(ref_b, PROMPTS[3], resumed, precision)


def test_graphed_and_eager_decoding_agree() -> None:
    model = replica(0, "fp32")
    results = []
    for graphs in (True, False):
        engine = MegatronEngine(model, SPEC, eos_token_id=None, stop_on_eos=False, max_batch_size=8, cuda_graphs=graphs)

        async def scenario(engine: MegatronEngine = engine) -> list[Generation]:
            calls = [engine.generate(p, SamplingParams(20, temperature=0.8, seed=i)) for i, p in enumerate(PROMPTS)]
            try:
                return list(await asyncio.gather(*calls))
            finally:
                await engine.shutdown()

        results.append(asyncio.run(scenario()))
    for graphed, eager in zip(*results, strict=True):
        assert graphed.token_ids == eager.token_ids
        assert torch.allclose(torch.tensor(graphed.logprobs), torch.tensor(eager.logprobs), atol=1e-4)


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_a_paged_engine_matches_full_forwards_and_preempts_when_its_blocks_run_out(fused: bool) -> None:
    """bf16, CUDA-graphed, on a paged KV cache: a prompt group and lone prompts, first with blocks to spare, then
    with a pool a third of what the rows need (the newest rows are preempted and prefill again); every completion's
    greedy tokens follow the reference and sampled ones score as the trainer does."""
    ref = replica(0, "bf16")
    group = [(PROMPTS[5], SamplingParams(40, temperature=1.0, seed=s)) for s in range(4)]
    calls = [(p, SamplingParams(40, temperature=0.0)) for p in PROMPTS] + group
    for blocks in (None, 1 + 6):
        engine = engine_on_bf16(max_batch_size=16, fused_decode=fused, kv_cache_layout="paged", kv_cache_blocks=blocks)

        async def scenario(engine: MegatronEngine = engine) -> list[Generation]:
            try:
                return list(await asyncio.gather(*(engine.generate(p, s) for p, s in calls)))
            finally:
                await engine.shutdown()

        generations = asyncio.run(scenario())
        for (prompt, sampling), generation in zip(calls, generations, strict=True):
            assert len(generation.token_ids) == 40
            if sampling.temperature == 0.0:
                check(ref, prompt, generation, "bf16")
            else:
                ids = torch.tensor([prompt + generation.token_ids], device="cuda")
                with torch.no_grad():
                    trainer = token_logprobs(ref, ids)[0, len(prompt) :].float().cpu()
                assert float((trainer - torch.tensor(generation.logprobs)).abs().max()) < TOLERANCE["bf16"]


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_the_decode_attention_kernel_reads_each_row_exactly(cache_dtype: torch.dtype) -> None:
    """Rows ending before, on and after a 256-position split's edge, on a bf16 cache and an fp8 one (read in
    bf16); positions past a row's own hold NaN, so reading one would show."""
    from sc_lightning.engines.megatron import decode_kernels

    g = torch.Generator(device="cuda").manual_seed(0)
    rows, groups, hpg, dim, length = 5, 8, 2, 128, 600
    cache = torch.randn(8, length, groups, 2, dim, generator=g, device="cuda")
    query = torch.randn(rows, groups, hpg, dim, generator=g, device="cuda").bfloat16()
    positions = torch.tensor([0, 63, 255, 256, 599], device="cuda")
    cache[:rows, 1:][positions[:, None] < torch.arange(1, length, device="cuda")] = float("nan")  # never read
    cache = cache.to(cache_dtype)
    got = decode_kernels.decode_attention(query, cache, positions, dim**-0.5, split=256)
    for r, p in enumerate(positions.tolist()):
        seen = cache[r, : p + 1].float()  # (p + 1, G, 2, D)
        scores = torch.einsum("ghd,ngd->ghn", query[r].float(), seen[:, :, 0]) * dim**-0.5
        expected = torch.einsum("ghn,ngd->ghd", scores.softmax(-1), seen[:, :, 1]).reshape(-1)
        assert (got[r, 0].float() - expected).abs().max().item() < 2e-2, r


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_an_fp8_kv_cache_samples_close_to_the_trainer(fused: bool) -> None:
    """bf16 on an fp8 cache, CUDA-graphed, requests joining mid-run and prompts prefilled in chunks: each sampled
    token's logprob is the trainer's up to fp8's rounding of K and V (0.1 nats on average, 0.5 at worst)."""
    ref = replica(0, "bf16")
    engine = engine_on_bf16(max_batch_size=8, prefill_chunk_tokens=32, fused_decode=fused, kv_cache_dtype="fp8")

    async def scenario() -> list[Generation]:
        try:
            calls = [engine.generate(p, SamplingParams(64, temperature=1.0, seed=i)) for i, p in enumerate(PROMPTS)]
            return list(await asyncio.gather(*calls))
        finally:
            await engine.shutdown()

    generations = asyncio.run(scenario())
    forward = engine._batch.forward
    assert forward.cache_dtype == torch.float8_e4m3fn and (forward.kernels is not None) == fused
    gaps = []
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        ids = torch.tensor([prompt + generation.token_ids], device="cuda")
        with torch.no_grad():
            trainer = token_logprobs(ref, ids)[0, len(prompt) :].float().cpu()
        gaps.append((trainer - torch.tensor(generation.logprobs)).abs())
    gaps = torch.cat(gaps)
    assert gaps.mean() < 0.1 and gaps.max() < 0.5, (gaps.mean(), gaps.max())


def argmax_gaps(ref: torch.nn.Module, prompt: tuple[int, ...], tokens: tuple[int, ...]) -> torch.Tensor:
    """Per new token: how far its logit is below the reference's top logit (0 where it is the argmax)."""
    ids = torch.tensor([prompt + tokens], device="cuda")
    with torch.no_grad():
        logits = logits_of(ref, ids)[0, len(prompt) - 1 : -1].float()
    chosen = torch.tensor(tokens, device="cuda")
    return (logits.max(-1).values - logits.gather(-1, chosen[:, None])[:, 0]).cpu()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_request_spanning_a_refit_records_both_versions_where_the_weights_changed(precision: str) -> None:
    """CUDA-graphed greedy decoding through an in-flight refit: the completion's tokens carry version 0 and then 1,
    and the split is where the sampling model changed (model a's argmax before it, model b's from it on)."""
    ref_a, ref_b = replica(0, precision), replica(1, precision)
    engine = MegatronEngine(
        replica(0, precision), SPEC, eos_token_id=None, stop_on_eos=False, max_batch_size=8, prefill_chunk_tokens=32
    )
    prompt, new = PROMPTS[3], 200

    async def scenario() -> Generation:
        request = asyncio.create_task(engine.generate(prompt, SamplingParams(new, temperature=0.0)))
        await until_sampled(engine, 10, [request])
        await engine.update_weights(export_hf_weights(ref_b, SPEC), version=1)
        result = await request
        await engine.shutdown()
        return result

    result = asyncio.run(scenario())
    versions, tol = result.token_versions, TOLERANCE[precision]
    split = versions.index(1)
    assert 10 <= split < new and versions == (0,) * split + (1,) * (new - split)
    assert result.weight_version == 0
    assert bool((argmax_gaps(ref_a, prompt, result.token_ids)[:split] <= tol).all())
    assert bool((argmax_gaps(ref_b, prompt, result.token_ids)[split:] <= tol).all())


@pytest.mark.parametrize("layout", ["slots", "paged"])
def test_an_engine_on_a_nearly_full_gpu_runs_fewer_rows_and_every_request_exactly(layout: str) -> None:
    """The KV cache is sized from the memory free when it is allocated, at each wake: an engine that stood down (as
    for a colocated trainer's step) wakes on a GPU filled but for ~140 MB, where 2% of it holds 3 slot rows of
    max_batch_size 16 (slots), or the blocks of 3.5 rows' whole contexts (paged); requests beyond them wait, and
    every one is exact (no OOM). Its kernels first ran with memory to spare, as they do in a run before the trainer's
    first step."""
    model = replica(0, "bf16")
    engine = MegatronEngine(
        model,
        SPEC,
        eos_token_id=None,
        stop_on_eos=False,
        max_batch_size=16,
        kv_cache_memory_fraction=0.02,
        kv_cache_layout=layout,
    )
    left = int(3.5 * engine._batch.forward.slot_bytes(SPEC.max_position_embeddings) / 0.02)  # what stays free
    blockers: list[torch.Tensor] = []

    async def scenario() -> tuple[list[Generation], KVCache]:
        try:
            await engine.generate(PROMPTS[2], SamplingParams(8, temperature=0.0))
            await engine.stand_down()  # the cache and the graphs go back to the device
            free = free_device_bytes(torch.device("cuda"))
            blockers.append(torch.empty(free - left, dtype=torch.uint8, device="cuda"))
            await engine.wake()
            generations = await generate_all(engine, 24)
            assert engine._batch.cache is not None
            return generations, engine._batch.cache
        finally:
            await engine.shutdown()

    generations, cache = asyncio.run(scenario())
    blockers.clear()
    if layout == "slots":
        assert 1 <= cache.slots < 16, cache.slots
    else:
        assert isinstance(cache, PagedKVCache)  # blocks to hold (beside the scratch one), fewer than 16 rows need
        assert 1 <= cache.tensor.size(1) - 1 < 16 * blocks_for(SPEC.max_position_embeddings), cache.tensor.size(1)
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        assert len(generation.token_ids) == 24
        check(model, prompt, generation, "bf16")
