"""Generation-engine throughput: MegatronEngine tokens/s at 1, 16 and 64 requests, the HBM bound, the trainer.

For each concurrency ``B``, ``B`` requests (prompt of ``--prompt-len`` tokens, ``--new-tokens`` sampled at temperature
1, eos ignored) are sent at once to one :class:`~sc_lightning.engines.megatron.engine.MegatronEngine`; the time
until the last one finishes gives the engine's generated tokens/s (prefill included). Figures are medians over
``--reps`` repetitions after one warm-up (which also captures the CUDA graphs on a GPU).

**HBM bound** (decode is memory-bound): a decode step of ``B`` rows must read the weights once and each row's K/V,

    bytes/step = (parameter bytes - input-embedding table + B x hidden x dtype bytes)      weights read
               + B x (prompt + (new - 1) / 2) x (layers x 2 x kv_groups x head_dim x cache bytes)   K/V read
    bound tokens/s = B / (bytes/step / --hbm-tbps)            (H200: 4.8 TB/s)

(cache bytes: the model's dtype's, or 1 with ``--kv-cache-dtype fp8``; a tied embedding is read whole by the output
layer and counted once; the mean context over the ``new`` steps is ``prompt + (new - 1) / 2``). "of bound" =
generated tokens/s / bound tokens/s. With ``--group G`` every prompt is asked by ``G`` requests (a GRPO group): the
engine prefills each prompt once and copies its K/V to the group's other rows.

**Trainer forward**: ``token_logprobs`` (forward only, no grad) of the same model over the very same ``B``
finished sequences (``B x (prompt + new)`` tokens), in micro-batches of at most ``--trainer-micro-tokens`` tokens as
the trainer's logprob pass takes them (one forward over 256 x 1,280 tokens would hold 21 GB of logits at a 32K
vocabulary), GPU synchronised before each clock. "engine / trainer" is the engine's *generated* tokens/s over the
trainer's forward tokens/s.

    python benchmarks/engine.py                      # builtin:tiny, B = 1 16 64, about 20 s on 2 CPU cores
    python benchmarks/engine.py --model /tmp/tiny-qwen2 --batches 1 16 --threads 1
    python benchmarks/engine.py --model 1.26b --device cuda --precision bf16   # issue 16's shape on one H200
    python benchmarks/engine.py --model 1.26b --device cuda --precision bf16 --batches 128 --prompt-len 256 --group 16
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import warnings
from collections.abc import Sequence
from typing import Any, get_args

import torch

from sc_lightning.engines.megatron.engine import KV_CACHE_DTYPES, MegatronEngine
from sc_lightning.engines.megatron.kv_rows import KVLayout
from sc_lightning.models import build_gpt_model, load_policy, token_logprobs
from sc_lightning.models.spec import ModelSpec, builtin_spec
from sc_lightning.types import Generation, SamplingParams

SHAPES = {  # the benchmark shapes (seeded random weights): issue 16's 1.26B Llama-style model, Llama-3.2-1B's shape
    "1.26b": builtin_spec("builtin:bench-1.26b"),
    "llama1b": builtin_spec("builtin:bench-llama1b"),
}


def prompts(batch: int, length: int, vocab: int, group: int = 1) -> list[tuple[int, ...]]:
    """``batch`` seeded prompts of ``length`` tokens (ids 3.., past the char tokenizer's specials), each distinct
    one asked by ``group`` consecutive requests (a GRPO prompt group's completions)."""
    gen = torch.Generator().manual_seed(batch)
    distinct = [tuple(torch.randint(3, vocab, (length,), generator=gen).tolist()) for _ in range(-(-batch // group))]
    return [distinct[i // group] for i in range(batch)]


async def engine_run(
    engine: MegatronEngine, batch: list[tuple[int, ...]], new: int | Sequence[int]
) -> tuple[float, list[Generation]]:
    """Seconds until all of ``batch`` is generated concurrently (``new`` tokens each, or each its own), and the
    generations."""
    lengths = [new] * len(batch) if isinstance(new, int) else list(new)
    sampling = [SamplingParams(n, temperature=1.0, seed=i) for i, n in enumerate(lengths)]
    start = time.perf_counter()
    out = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(batch, sampling, strict=True)))
    return time.perf_counter() - start, list(out)


def trainer_run(model: torch.nn.Module, ids: torch.Tensor, micro_tokens: int) -> float:
    """Seconds of ``token_logprobs`` (no grad) over ``ids`` in micro-batches of at most ``micro_tokens`` tokens (a
    row at least), the GPU synchronised before each clock."""
    rows = max(1, micro_tokens // ids.size(1))
    synchronize(ids.device)
    start = time.perf_counter()
    with torch.no_grad():
        for chunk in ids.split(rows):
            token_logprobs(model, chunk)
    synchronize(ids.device)
    return time.perf_counter() - start


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, ModelSpec]:
    """The model to serve: a named shape (seeded random weights), ``builtin:<name>`` or an HF directory."""
    if args.model in SHAPES:
        spec = SHAPES[args.model]
        return build_gpt_model(spec, precision=args.precision, device=args.device), spec
    model, spec, _ = load_policy(args.model, precision=args.precision, device=args.device)
    return model, spec


def decode_weight_bytes(model: torch.nn.Module, spec: ModelSpec, batch: int) -> int:
    """Bytes of weights one decode step of ``batch`` rows reads: every parameter once, of an untied input-embedding
    table only the ``batch`` rows looked up."""
    size = next(model.parameters()).element_size()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if not spec.tie_word_embeddings:
        weights -= spec.padded_vocab_size() * spec.hidden_size * size
    return weights + batch * spec.hidden_size * size


def kv_bytes_per_position(spec: ModelSpec, cache_bytes: int) -> int:
    """Bytes of K and V one cached position holds over all layers (``cache_bytes`` a value)."""
    return spec.num_layers * 2 * spec.num_query_groups * spec.kv_channels * cache_bytes


def add_kv_cache_options(parser: argparse.ArgumentParser) -> None:
    """``--kv-cache-dtype`` and ``--kv-cache-layout``: the engine's KV cache, as the config's knobs set it."""
    parser.add_argument(
        "--kv-cache-dtype", choices=sorted(KV_CACHE_DTYPES), default="auto", help="its dtype (auto: the model's)"
    )
    parser.add_argument("--kv-cache-layout", choices=get_args(KVLayout), default="paged", help="paged blocks or slots")


def cache_value_bytes(model: torch.nn.Module, kv_cache_dtype: str) -> int:
    """Bytes of one cached K/V value in the engine's ``kv_cache_dtype`` cache (auto: the model's dtype's)."""
    return (KV_CACHE_DTYPES[kv_cache_dtype] or next(model.parameters()).dtype).itemsize


def hbm_bound(model: torch.nn.Module, spec: ModelSpec, batch: int, args: argparse.Namespace) -> dict[str, float]:
    """Bytes one decode step of ``batch`` rows must read (weights, K/V) and the tokens/s that allows."""
    weights = decode_weight_bytes(model, spec, batch)
    per_position = kv_bytes_per_position(spec, cache_value_bytes(model, args.kv_cache_dtype))
    kv = batch * (args.prompt_len + (args.new_tokens - 1) / 2) * per_position
    step_s = (weights + kv) / (args.hbm_tbps * 1e12)
    return {"weights_gb": weights / 1e9, "kv_gb": kv / 1e9, "bound_ms": step_s * 1e3, "bound_tps": batch / step_s}


async def measure_batch(
    engine: MegatronEngine, model: torch.nn.Module, spec: ModelSpec, batch_size: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One row of figures for ``batch_size`` concurrent requests."""
    batch = prompts(batch_size, args.prompt_len, spec.vocab_size, args.group)
    await engine_run(engine, batch, args.new_tokens)  # warm-up (captures this size's CUDA graphs)
    before = engine.stats
    engine_s, trainer_s = [], []
    for _ in range(args.reps):
        seconds, generations = await engine_run(engine, batch, args.new_tokens)
        engine_s.append(seconds)
    steps = (engine.stats.decode_steps - before.decode_steps) / args.reps
    ids = torch.tensor([p + g.token_ids for p, g in zip(batch, generations, strict=True)], device=args.device)
    micro = args.trainer_micro_tokens
    trainer_run(model, ids, micro)  # warm-up at this shape (the engine is idle: its model serves as the trainer's)
    trainer_s = [trainer_run(model, ids, micro) for _ in range(args.reps)]
    e, t = statistics.median(engine_s), statistics.median(trainer_s)
    gen_tps = batch_size * args.new_tokens / e
    trainer_tps = batch_size * (args.prompt_len + args.new_tokens) / t
    bound = hbm_bound(model, spec, batch_size, args)
    return {"batch": batch_size, "engine_s": e, "step_ms": e / steps * 1e3, "gen_tps": gen_tps, **bound} | {
        "of_bound": gen_tps / bound["bound_tps"],
        "trainer_tps": trainer_tps,
        "ratio": gen_tps / trainer_tps,
    }


async def profile(engine: MegatronEngine, spec: ModelSpec, batch_size: int, args: argparse.Namespace) -> None:
    """Print the GPU kernels of one run of ``batch_size`` requests (torch.profiler), by total time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    batch = prompts(batch_size, args.prompt_len, spec.vocab_size, args.group)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        seconds, _ = await engine_run(engine, batch, args.new_tokens)
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    print(f"profile of B={batch_size}: {seconds * 1e3:.1f} ms wall, GPU kernels {kernel_us / 1e3:.1f} ms busy")
    print(events.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row of figures per concurrency level; prints the engine's counters (and a profile when asked)."""
    model, spec = build(args)
    engine = MegatronEngine(
        model,
        spec,
        eos_token_id=None,
        stop_on_eos=False,
        max_batch_size=max(args.batches),
        max_seq_len=args.prompt_len + args.new_tokens,
        flash_decode=args.flash,
        fused_decode=args.fused,
        kv_cache_dtype=args.kv_cache_dtype,
        kv_cache_layout=args.kv_cache_layout,
    )
    try:
        rows = [await measure_batch(engine, model, spec, b, args) for b in args.batches]
        forward = engine._batch.forward
        attention = "flash (varlen)" if forward.flash else "memory-efficient" if forward.efficient else "torch SDPA"
        fused = "fused kernels" if forward.kernels is not None else "unfused"
        print(f"engine stats: {engine.stats}; decode attention: {attention}; {fused}")
        if args.profile:
            await profile(engine, spec, max(args.batches), args)
        return rows
    finally:
        await engine.shutdown()


def main() -> None:
    """Command line: print the table of engine tokens/s, the HBM bound and the trainer's forward."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny", help=f"builtin:NAME, an HF directory, or {list(SHAPES)}")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--group", type=int, default=1, help="requests asking each prompt (a GRPO group: 16)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="where the engine and the trainer run (e.g. cuda)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM bandwidth, TB/s (H200: 4.8)")
    parser.add_argument(
        "--trainer-micro-tokens", type=int, default=16384, help="tokens of one trainer forward (a row at least)"
    )
    parser.add_argument("--profile", action="store_true", help="then profile one run at the largest batch")
    add_kv_cache_options(parser)
    parser.add_argument("--flash-decode", dest="flash", action="store_true", help="decode on flash attention")
    parser.add_argument(
        "--unfused-decode", dest="fused", action="store_false", help="decode without the fused Triton kernels"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")
    rows = asyncio.run(measure(args))
    print(
        f"model {args.model} ({args.precision} on {args.device}), prompt {args.prompt_len} + {args.new_tokens} new "
        f"tokens, torch threads {torch.get_num_threads()}, medians of {args.reps}"
    )
    print(
        "| concurrent requests | engine s | ms / decode step | generated tok/s | bytes/step (weights + KV) GB "
        "| HBM-bound tok/s | of bound | trainer forward tok/s | engine / trainer |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['engine_s']:.3f} | {r['step_ms']:.2f} | {r['gen_tps']:,.0f} "
            f"| {r['weights_gb']:.3f} + {r['kv_gb']:.3f} | {r['bound_tps']:,.0f} | {r['of_bound']:.1%} "
            f"| {r['trainer_tps']:,.0f} | {r['ratio']:.2%} |"
        )


if __name__ == "__main__":
    main()
