"""The Megatron engine's fp8 KV cache (``kv_cache_dtype: fp8``) on the CPU: its bytes, its saturation, and an engine
sampling on it next to the trainer. The GPU's fused kernels writing and reading fp8 are checked by
``tests/gpu/test_engine_gpu.py``."""

from __future__ import annotations

import asyncio

import pytest
import torch

from sc_lightning.engines.megatron.cached_forward import CachedForward, write_kv
from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.engines.megatron.kv_cache import FP8
from sc_lightning.engines.sampling import scoring_temperature
from sc_lightning.models import load_policy, token_logprobs
from sc_lightning.types import SamplingParams

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]
PROMPTS = [(3,), (4, 5, 6), (7, 8, 9, 10, 11, 12, 13), (14, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)]


def test_an_fp8_cache_holds_one_byte_a_value_and_the_budget_counts_it() -> None:
    model = load_policy("builtin:tiny")[0].eval()
    native, fp8 = CachedForward(model, 256), CachedForward(model, 256, kv_cache_dtype=FP8)
    cache = fp8.new_cache(3, 100)
    assert cache.tensor.dtype == FP8 and fp8.slot_bytes(100) * 3 == cache.tensor.nbytes
    assert fp8.slot_bytes(100) * native.dtype.itemsize == native.slot_bytes(100)  # a quarter of fp32, half of bf16
    with pytest.raises(ValueError, match="the model's dtype or fp8"):
        CachedForward(model, 256, kv_cache_dtype=torch.float16)


def test_values_past_fp8s_range_saturate_instead_of_turning_nan() -> None:
    flat = torch.zeros((4, 1, 2, 2), dtype=FP8)
    kv = torch.tensor([[[[1000.0, -1000.0], [0.5, -3.0]]], [[[448.0, 1e9], [0.0, 2.0**-7]]]])
    write_kv(flat, torch.tensor([2, 0]), kv)
    assert flat[2].float().flatten().tolist() == [448.0, -448.0, 0.5, -3.0]
    assert flat[0].float().flatten().tolist() == [448.0, 448.0, 0.0, 2.0**-7]
    assert flat[[1, 3]].float().abs().sum() == 0  # the other rows untouched


def generate(engine: MegatronEngine, settings: list[SamplingParams]) -> list:
    """The engine's generations of ``PROMPTS`` under ``settings``, then the engine shut down."""

    async def scenario() -> list:
        try:
            return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(PROMPTS, settings, strict=True)))
        finally:
            await engine.shutdown()

    return asyncio.run(scenario())


def test_an_engine_on_an_fp8_cache_samples_close_to_the_trainer(tiny_dirs: dict) -> None:
    """The same seeded requests on the model's-dtype cache and on fp8: the fp8 engine's logprobs are the trainer's up
    to fp8's rounding of K and V (2% of a value at the median here; this tiny random model measured 0.037 nats on
    average, 0.17 at worst), against 1e-4 without it; they differ from the exact ones, so fp8 is what was read."""
    settings = [SamplingParams(16, temperature=1.0, seed=i) for i in range(len(PROMPTS))]
    path = str(tiny_dirs["llama"])
    ref = load_policy(path)[0].eval()
    gaps = {}
    for dtype in ("auto", "fp8"):
        engine = MegatronEngine.from_pretrained(path, stop_on_eos=False, kv_cache_dtype=dtype)
        assert engine._batch.forward.cache_dtype == (FP8 if dtype == "fp8" else torch.float32)
        gap = []
        for prompt, generation in zip(PROMPTS, generate(engine, settings), strict=True):
            ids = torch.tensor([prompt + generation.token_ids])
            with torch.no_grad():
                trainer = token_logprobs(ref, ids, temperature=scoring_temperature(1.0))[0, len(prompt) :]
            gap.append((trainer - torch.tensor(generation.logprobs)).abs())
        gaps[dtype] = (torch.cat(gap).mean().item(), torch.cat(gap).max().item())
    assert gaps["auto"][1] < 1e-4, gaps
    mean, worst = gaps["fp8"]
    assert 1e-4 < mean < 0.1 and worst < 0.5, gaps


def test_the_dtype_must_be_auto_or_fp8() -> None:
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \['auto', 'fp8'\], got 'int8'"):
        MegatronEngine.from_pretrained("builtin:tiny", kv_cache_dtype="int8")
