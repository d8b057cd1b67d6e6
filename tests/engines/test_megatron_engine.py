"""MegatronEngine decoding: greedy == full-forward argmax, logprobs == the trainer's, batching, stops, errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from sc_lightning.engines.base import EngineError, GenerationEngine
from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.engines.sampling import scoring_temperature
from sc_lightning.models import load_policy, token_logprobs
from sc_lightning.types import SamplingParams
from tests.engines.helpers import WorkerGate, follows_argmax

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]

PROMPTS = [(3,), (4, 5, 6), (7, 8, 9, 10, 11, 12, 13), (14, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13), (15, 16, 17, 3, 4)]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def engine_on(path: Path | str, **kwargs: object) -> MegatronEngine:
    """An engine on a fresh replica of ``path`` that ignores eos unless told otherwise (fixed-length outputs)."""
    kwargs.setdefault("stop_on_eos", False)
    return MegatronEngine.from_pretrained(str(path), **kwargs)


def reference(path: Path | str) -> torch.nn.Module:
    """An independent replica of ``path`` for full-forward references (never the engine's own model)."""
    return load_policy(str(path))[0].eval()


@pytest.mark.parametrize("greedy", [SamplingParams(12, temperature=0.0), SamplingParams(12, temperature=0.8, top_k=1)])
def test_greedy_equals_full_forward_argmax_at_every_position(tiny_dirs: dict, greedy: SamplingParams) -> None:
    async def scenario() -> list:
        engine = engine_on(tiny_dirs["a"])
        try:
            return await asyncio.gather(*(engine.generate(p, greedy) for p in PROMPTS))
        finally:
            await engine.shutdown()

    ref = reference(tiny_dirs["a"])
    for prompt, generation in zip(PROMPTS, asyncio.run(scenario()), strict=True):
        assert generation.finish_reason == "length" and len(generation.token_ids) == 12
        assert all(follows_argmax(ref, prompt, generation.token_ids)), (prompt, generation.token_ids)


@pytest.mark.parametrize("model", ["llama", "qwen3"])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_equal_the_trainers_token_logprobs(tiny_dirs: dict, temperature: float, model: str) -> None:
    settings = [
        SamplingParams(16, temperature=temperature, seed=1),
        SamplingParams(16, temperature=temperature, top_k=6, seed=2),
        SamplingParams(16, temperature=temperature, top_p=0.8, seed=3),
        SamplingParams(16, temperature=temperature, top_k=8, top_p=0.9, seed=4),
    ]

    async def scenario() -> list:
        engine = engine_on(tiny_dirs[model])
        try:
            return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(PROMPTS, settings, strict=False)))
        finally:
            await engine.shutdown()

    ref = reference(tiny_dirs[model])
    for prompt, generation in zip(PROMPTS, asyncio.run(scenario()), strict=False):
        ids = torch.tensor([prompt + generation.token_ids])
        with torch.no_grad():
            trainer = token_logprobs(ref, ids, temperature=scoring_temperature(temperature))[0, len(prompt) :].cpu()
        assert torch.allclose(trainer, torch.tensor(generation.logprobs), atol=1e-4), (trainer, generation.logprobs)


def test_concurrent_requests_share_batches_and_match_single_requests(tiny_dirs: dict) -> None:
    prompts = [tuple(3 + (i * 7 + j) % 15 for j in range(2 + i % 6)) for i in range(24)]
    settings = [GREEDY if i % 2 else SamplingParams(12, temperature=0.9, top_p=0.95, seed=i) for i in range(24)]

    async def scenario() -> tuple[list, list, int]:
        engine = engine_on(tiny_dirs["a"], max_batch_size=32)
        try:
            together = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, settings, strict=True)))
            batches = engine.stats.batches
            alone = [await engine.generate(p, s) for p, s in zip(prompts, settings, strict=True)]
            return together, alone, batches
        finally:
            await engine.shutdown()

    together, alone, batches = asyncio.run(scenario())
    assert batches < len(prompts) / 4, batches
    for batched, single in zip(together, alone, strict=True):
        assert batched.token_ids == single.token_ids
        assert torch.allclose(torch.tensor(batched.logprobs), torch.tensor(single.logprobs), atol=1e-5)


def test_stop_tokens_end_the_completion_and_are_included(tiny_dirs: dict) -> None:
    prompt = (4, 5, 6)

    async def scenario() -> None:
        engine = engine_on(tiny_dirs["a"])
        full = (await engine.generate(prompt, SamplingParams(20, temperature=0.0))).token_ids
        stop = full[4]
        cut = full.index(stop) + 1
        per_call = await engine.generate(prompt, SamplingParams(20, temperature=0.0), stop_token_ids=[stop])
        assert per_call.token_ids == full[:cut] and per_call.finish_reason == "stop"
        assert len(per_call.logprobs) == cut
        await engine.shutdown()
        model, spec, _ = load_policy(str(tiny_dirs["a"]))
        as_eos = MegatronEngine(model, spec, eos_token_id=stop)
        assert (await as_eos.generate(prompt, SamplingParams(20, temperature=0.0))).token_ids == full[:cut]
        await as_eos.shutdown()
        extra = engine_on(tiny_dirs["a"], extra_stop_token_ids=[stop])
        assert (await extra.generate(prompt, SamplingParams(20, temperature=0.0))).finish_reason == "stop"
        await extra.shutdown()

    asyncio.run(scenario())


def test_a_request_ignoring_eos_runs_to_its_length_and_keeps_the_other_stop_tokens(tiny_dirs: dict) -> None:
    prompt = (4, 5, 6)

    async def scenario() -> None:
        full = (await engine_on(tiny_dirs["a"]).generate(prompt, SamplingParams(20, temperature=0.0))).token_ids
        eos, other = full[2], full[6]  # greedy from the same weights: both come up, eos first
        model, spec, _ = load_policy(str(tiny_dirs["a"]))
        engine = MegatronEngine(model, spec, eos_token_id=eos)
        stopped = await engine.generate(prompt, SamplingParams(20, temperature=0.0))
        assert stopped.token_ids == full[: full.index(eos) + 1] and stopped.finish_reason == "stop"
        past_eos = SamplingParams(20, temperature=0.0, ignore_eos=True)
        ignoring = await engine.generate(prompt, past_eos)
        assert ignoring.token_ids == full and ignoring.finish_reason == "length"
        cut = await engine.generate(prompt, past_eos, stop_token_ids=[other])
        assert cut.token_ids == full[: full.index(other) + 1] and cut.finish_reason == "stop"
        await engine.shutdown()

    asyncio.run(scenario())


def test_default_stop_tokens_are_the_tokenizer_eos_plus_extras(tiny_dirs: dict) -> None:
    model, spec, tokenizer = load_policy(str(tiny_dirs["a"]))
    engine = MegatronEngine(model, spec, eos_token_id=tokenizer.eos_token_id, extra_stop_token_ids=[7, 9])
    assert engine.stop_token_ids == {tokenizer.eos_token_id, 7, 9}
    assert MegatronEngine.from_pretrained("builtin:tiny").stop_token_ids == {1}
    asyncio.run(engine.shutdown())


def test_max_new_tokens_and_the_context_end_give_length(tiny_dirs: dict) -> None:
    async def scenario() -> None:
        engine = engine_on(tiny_dirs["a"], max_seq_len=32)
        seven = await engine.generate((3, 4), SamplingParams(7, temperature=1.0, seed=0))
        assert len(seven.token_ids) == 7 and seven.finish_reason == "length"
        none = await engine.generate((3, 4), SamplingParams(0))
        assert none.token_ids == () and none.finish_reason == "length"
        edge = await engine.generate(tuple([5] * 29), SamplingParams(20, temperature=0.0))
        assert len(edge.token_ids) == 3 and edge.finish_reason == "length"
        await engine.shutdown()

    asyncio.run(scenario())


def test_errors_name_the_engine_and_the_request(tiny_dirs: dict) -> None:
    async def scenario() -> None:
        engine = engine_on(tiny_dirs["a"], name="gen-0")
        assert isinstance(engine, GenerationEngine)
        cases = [(tuple([3] * 256), SamplingParams(4)), ((), SamplingParams(4)), ((3, 99), SamplingParams(4))]
        cases.append(((3,), SamplingParams(4, top_p=0.0)))
        for prompt, sampling in cases:
            with pytest.raises(EngineError, match=r"engine 'gen-0', request req-\d+"):
                await engine.generate(prompt, sampling)
        with pytest.raises(EngineError, match="update failed"):
            await engine.update_weights([("model.embed_tokens.weight", torch.zeros(2, 2))], 1)
        assert engine.weight_version == 0
        ok = await engine.generate((3, 4), SamplingParams(3))  # still serving
        assert len(ok.token_ids) == 3
        gate = WorkerGate(engine, engine.stats.generated_tokens + 5)
        long = asyncio.create_task(engine.generate((3, 4), SamplingParams(200, temperature=0.0)))
        await (await gate.during(engine.shutdown()))
        aborted = await long
        assert aborted.finish_reason == "abort" and 0 < len(aborted.token_ids) < 200
        await engine.shutdown()  # idempotent
        with pytest.raises(EngineError, match="shut down"):
            await engine.generate((3,), SamplingParams(2))
        with pytest.raises(EngineError, match="shut down"):
            await engine.update_weights([], 2)

    asyncio.run(scenario())
