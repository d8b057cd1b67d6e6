"""The Megatron engine's decode-attention kernel against a memcpy of the same device, split vs unsplit.

A decode step's attention reads every row's cached K/V once: at 1.26B's shape (8 KV groups x 128, 24 layers) a row
at a 1,300-token context reads 125 MB a step against 2.5 GB of weights, so past a few dozen rows this kernel *is*
the decode step. Its bound is bandwidth, so its figure is the bytes it must read (each row's ``p + 1`` positions x
groups x K and V x head_dim x dtype bytes) over its time, against the device's own copy bandwidth measured in the
same run (one ``copy_`` of 2 GiB: bytes read + written / time).

Rows' contexts (``p + 1``) come from three distributions, over one layer's cache of ``--length`` positions:

  full       every row at ``--full-context`` (benchmarks/engine.py's shape: 256 + 1,024)
  longtail   256 + a lognormal answer of mean ``--length / 4`` seen part-way (the e2e benchmark's workload mid-step)
  tail       ``--tail-rows`` rows of ``--length`` each: the step's last long answers decoding alone

For each, the unsplit kernel (one program per row and group reading its whole context: ``split`` = the cache's
length) against splits of ``--splits`` positions, at ``--blocks`` positions per loop iteration; with ``--paged``,
also the paged kernel on the same K/V in shuffled 64-position blocks (the engine's ``kv_cache_layout: paged``).
Medians of ``--reps`` timed launches (CUDA events) after a warm-up. Needs a GPU.

    python benchmarks/decode_attention.py                          # 1.26b and llama1b shapes, 128 and 256 rows
    python benchmarks/decode_attention.py --shapes 1.26b --rows 256 --splits 128 256 512 --blocks 32 64 128
    python benchmarks/decode_attention.py --kv-cache-dtype fp8      # an fp8 cache: half the bytes to read
    python benchmarks/decode_attention.py --paged --splits 512 --blocks 64   # slots vs the same K/V paged
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
from typing import Any

import torch

SHAPES = {"1.26b": (8, 2, 128), "llama1b": (8, 4, 64)}  # (KV groups, query heads per group, head_dim)
CACHE_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}  # the engine's kv_cache_dtype auto (bf16), fp8


def copy_bandwidth(reps: int) -> float:
    """Bytes/s of one device-to-device ``copy_`` of 2 GiB (read + written), median of ``reps``."""
    source = torch.empty(2**30, dtype=torch.bfloat16, device="cuda")
    target = torch.empty_like(source)
    seconds = timed(lambda: target.copy_(source), reps)
    return 2 * source.numel() * source.element_size() / seconds


def timed(launch: Any, reps: int) -> float:
    """Median seconds of ``launch()`` over ``reps`` launches after one warm-up, each between CUDA events."""
    launch()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


PAGE = 64  # positions of a paged cache's block (the engine's)


def scattered_blocks(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The slot ``cache`` ``(rows, length, ...)`` as a paged pool of :data:`PAGE`-position blocks in shuffled order
    (a long-running engine's blocks are anywhere in its pool) and the rows' block tables reading the same values."""
    rows, length = cache.shape[:2]
    per_row = length // PAGE
    order = torch.randperm(rows * per_row, generator=torch.Generator().manual_seed(0)).to(cache.device)
    blocks = cache[:, : per_row * PAGE].reshape(rows * per_row, PAGE, *cache.shape[2:])
    pool = torch.empty_like(blocks)
    pool[order] = blocks  # block i of the slots lands at pool[order[i]]
    return pool, order.view(rows, per_row).to(torch.int32)


def contexts(kind: str, rows: int, args: argparse.Namespace) -> torch.Tensor:
    """Each row's context ``p + 1`` under distribution ``kind`` (seeded)."""
    gen = torch.Generator().manual_seed(rows)
    if kind == "full":
        return torch.full((rows,), args.full_context)
    if kind == "tail":
        return torch.full((args.tail_rows,), args.length)
    mean, sigma = args.length / 4, 1.0
    answers = torch.exp(torch.randn(rows, generator=gen) * sigma + math.log(mean) - sigma**2 / 2)
    seen = torch.rand(rows, generator=gen)  # how far through its answer each row is
    return (256 + (answers * seen).long()).clamp(1, args.length)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One result per shape, rows, distribution and kernel setting."""
    from sc_lightning.engines.megatron.decode_kernels import decode_attention

    copy_bps = copy_bandwidth(args.reps)
    print(f"copy bandwidth {copy_bps / 1e12:.2f} TB/s (2 GiB copy_, read + written)", flush=True)
    results = []
    for shape in args.shapes:
        groups, hpg, dim = SHAPES[shape]
        for rows in args.rows:
            cache = torch.randn(rows, args.length, groups, 2, dim, device="cuda", dtype=torch.bfloat16)
            cache = cache.to(CACHE_DTYPES[args.kv_cache_dtype])
            query = torch.randn(rows, groups, hpg, dim, device="cuda", dtype=torch.bfloat16)
            if args.paged:
                paged_cache, paged_tables = scattered_blocks(cache)
            for kind in ("full", "longtail", "tail"):
                seen = contexts(kind, rows, args).cuda()
                positions, used = seen - 1, query[: seen.numel()]
                bytes_read = int(seen.sum()) * groups * 2 * dim * cache.element_size()
                settings = [(args.length, 64, None)]
                settings += [(s, b, None) for s in args.splits for b in args.blocks if b <= s]
                if args.paged:
                    settings += [(s, PAGE, paged_tables) for s in args.splits if s % PAGE == 0]
                base = None
                for split, block, tables in settings:
                    source = cache if tables is None else paged_cache
                    launch = functools.partial(
                        decode_attention, used, source, positions, dim**-0.5, split=split, block=block, tables=tables
                    )
                    seconds = timed(launch, args.reps)
                    base = base or seconds
                    results.append(
                        {
                            "shape": shape,
                            "rows": seen.numel(),
                            "contexts": kind,
                            "mean_context": float(seen.float().mean()),
                            "split": "none" if split == args.length else split,
                            "block": block,
                            "layout": "slots" if tables is None else "paged",
                            "us": seconds * 1e6,
                            "of_copy": bytes_read / seconds / copy_bps,
                            "speedup": base / seconds,
                        }
                    )
                    print(
                        f"{shape:8} rows {seen.numel():4} {kind:8} mean ctx {results[-1]['mean_context']:6.0f}  "
                        f"{results[-1]['layout']:5} split {results[-1]['split']!s:>5} block {block:3}  "
                        f"{seconds * 1e6:8.1f} us  "
                        f"{bytes_read / seconds / 1e12:5.2f} TB/s  {results[-1]['of_copy']:6.1%} of copy  "
                        f"{results[-1]['speedup']:5.2f}x unsplit",
                        flush=True,
                    )
    return results


def main() -> None:
    """Parse the arguments and print one line per kernel setting."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["1.26b", "llama1b"])
    parser.add_argument("--rows", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--length", type=int, default=4352, help="cached positions per row (256 + 4,096)")
    parser.add_argument("--full-context", type=int, default=1280)
    parser.add_argument("--tail-rows", type=int, default=8)
    parser.add_argument("--splits", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--kv-cache-dtype", choices=sorted(CACHE_DTYPES), default="bf16", help="the cache's dtype")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--paged", action="store_true", help="also time a paged cache (shuffled 64-position blocks)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/decode_attention.py needs a GPU")
    measure(args)


if __name__ == "__main__":
    main()
