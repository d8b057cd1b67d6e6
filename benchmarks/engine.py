"""Generation-engine throughput: MegatronEngine tokens/s at 1, 16 and 64 concurrent requests vs the trainer's forward.

For each concurrency ``B``, ``B`` requests (prompt of ``--prompt-len`` tokens, ``--new-tokens`` sampled at temperature
1, eos ignored) are sent at once to one :class:`~sc_lightning.engines.megatron.MegatronEngine`; the time until the
last one finishes gives the engine's generated tokens/s and total tokens/s (prompt + completion). The trainer's
baseline is ``token_logprobs`` (one full forward, no grad) over the very same ``B`` finished sequences: the same
total tokens, scored instead of generated. Figures are medians over ``--reps`` repetitions after one warm-up.

    python benchmarks/engine.py                      # builtin:tiny, B = 1 16 64, about 1 min on 2 CPU cores
    python benchmarks/engine.py --model /tmp/tiny-qwen2 --batches 1 16 --threads 1
    python benchmarks/engine.py --model /path/to/hf-model --device cuda --precision bf16   # on a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import warnings

import torch

from sc_lightning.engines.megatron import MegatronEngine
from sc_lightning.models import load_policy, token_logprobs
from sc_lightning.types import Generation, SamplingParams


def prompts(batch: int, length: int, vocab: int) -> list[tuple[int, ...]]:
    """``batch`` distinct seeded prompts of ``length`` tokens (ids 3.., past the char tokenizer's specials)."""
    gen = torch.Generator().manual_seed(batch)
    return [tuple(torch.randint(3, vocab, (length,), generator=gen).tolist()) for _ in range(batch)]


async def engine_run(engine: MegatronEngine, batch: list[tuple[int, ...]], new: int) -> tuple[float, list[Generation]]:
    """Seconds until all of ``batch`` is generated concurrently, and the generations."""
    sampling = [SamplingParams(new, temperature=1.0, seed=i) for i in range(len(batch))]
    start = time.perf_counter()
    out = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(batch, sampling, strict=True)))
    return time.perf_counter() - start, list(out)


def trainer_run(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Seconds of one ``token_logprobs`` forward (no grad) over ``ids`` (the GPU synchronised before each clock)."""
    synchronize(ids.device)
    start = time.perf_counter()
    with torch.no_grad():
        token_logprobs(model, ids)
    synchronize(ids.device)
    return time.perf_counter() - start


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


async def measure(args: argparse.Namespace) -> list[dict[str, float]]:
    """One row of figures per concurrency level."""
    place = {"precision": args.precision, "device": args.device}
    engine = MegatronEngine.from_pretrained(args.model, stop_on_eos=False, max_batch_size=max(args.batches), **place)
    trainer, spec, _ = load_policy(args.model, **place)
    trainer.eval()
    vocab = spec.vocab_size
    rows = []
    try:
        for batch_size in args.batches:
            batch = prompts(batch_size, args.prompt_len, vocab)
            await engine_run(engine, batch, args.new_tokens)  # warm-up
            engine_s, trainer_s = [], []
            for _ in range(args.reps):
                seconds, generations = await engine_run(engine, batch, args.new_tokens)
                engine_s.append(seconds)
                ids = torch.tensor(
                    [p + g.token_ids for p, g in zip(batch, generations, strict=True)], device=args.device
                )
                trainer_run(trainer, ids)  # warm-up at this shape
                trainer_s.append(trainer_run(trainer, ids))
            total = batch_size * (args.prompt_len + args.new_tokens)
            e, t = statistics.median(engine_s), statistics.median(trainer_s)
            rows.append(
                {
                    "batch": batch_size,
                    "engine_s": e,
                    "gen_tps": batch_size * args.new_tokens / e,
                    "engine_tps": total / e,
                }
                | {"trainer_s": t, "trainer_tps": total / t, "ratio": (total / e) / (total / t)}
            )
    finally:
        await engine.shutdown()
    return rows


def main() -> None:
    """Command line: print the table of engine vs trainer tokens/s."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="where the engine and the trainer run (e.g. cuda)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
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
        "| concurrent requests | engine s | generated tok/s | engine total tok/s | trainer forward s "
        "| trainer tok/s | engine / trainer |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['engine_s']:.3f} | {r['gen_tps']:,.0f} | {r['engine_tps']:,.0f} "
            f"| {r['trainer_s']:.4f} | {r['trainer_tps']:,.0f} | {r['ratio']:.2%} |"
        )


if __name__ == "__main__":
    main()
