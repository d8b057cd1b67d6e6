"""The Ray engine client's cost: a round of requests through RayMegatronEngine against the same engine in process.

The tiny examples' rollouts are rounds of short requests (a step's 64 completions of 4 tokens): there a Ray call
costs more than the tiny model's decode step, so how the client talks to its actor sets the step time. A round is
``--batch`` requests (prompt of ``--prompt-len`` tokens, ``--new-tokens`` sampled at temperature 1, eos ignored) sent
at once; its time is until the last one ends. Three ways, each the median of ``--rounds`` rounds after a warm-up:

- ``in-process``: one :class:`~sc_lightning.engines.megatron.engine.MegatronEngine` on this process's event loop,
  the bound;
- ``ray, batched``: :class:`~sc_lightning.engines.megatron.ray_engine.RayMegatronEngine` as the product uses it, the
  round's ``generate`` calls made in one loop turn, so they travel as one streaming Ray call;
- ``ray, a call each``: the same client with each ``generate`` made in its own loop turn, so each request is its own
  Ray call (how the client worked before it batched).

"x in-process" is each way's round time over the in-process one's.

    python benchmarks/ray_engine.py                  # builtin:tiny, 64 requests x 4 tokens, about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine
from sc_lightning.types import Generation, SamplingParams

Generate = Callable[[tuple[int, ...], SamplingParams], Awaitable[Generation]]


def prompts(batch: int, length: int) -> list[tuple[int, ...]]:
    """``batch`` prompts of ``length`` token ids in 3..12 (past the char tokenizer's specials, in any vocabulary)."""
    return [tuple(3 + (i * 7 + j * j) % 10 for j in range(length)) for i in range(batch)]


async def one_turn(generate: Generate, batch: list[tuple[int, ...]], new: int) -> None:
    """Every request of ``batch`` started in one turn of the event loop, all awaited."""
    await asyncio.gather(*(generate(p, SamplingParams(new, temperature=1.0, seed=i)) for i, p in enumerate(batch)))


async def a_turn_each(generate: Generate, batch: list[tuple[int, ...]], new: int) -> None:
    """Each request of ``batch`` started in its own turn of the event loop, all awaited."""
    tasks = []
    for i, p in enumerate(batch):
        tasks.append(asyncio.ensure_future(generate(p, SamplingParams(new, temperature=1.0, seed=i))))
        await asyncio.sleep(0)  # let this request's generate run (and its Ray call leave) before the next starts
    await asyncio.gather(*tasks)


async def median_round_s(send: Callable[[], Awaitable[None]], rounds: int) -> float:
    """Median seconds of ``rounds`` rounds of ``send()`` after one warm-up round."""
    await send()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await send()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def measure(args: argparse.Namespace) -> list[tuple[str, float]]:
    """Median round time of each way, in-process first."""
    import ray

    batch = prompts(args.batch, args.prompt_len)
    options: dict[str, Any] = {"stop_on_eos": False, "max_batch_size": args.batch}
    engine = MegatronEngine.from_pretrained(args.model, **options)
    try:
        rows = [
            ("in-process", await median_round_s(lambda: one_turn(engine.generate, batch, args.new_tokens), args.rounds))
        ]
    finally:
        await engine.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    client = RayMegatronEngine(args.model, **options)
    try:
        await client.ready()
        for name, send in (("ray, batched", one_turn), ("ray, a call each", a_turn_each)):
            rows.append(
                (name, await median_round_s(lambda s=send: s(client.generate, batch, args.new_tokens), args.rounds))
            )
    finally:
        await client.shutdown()
        ray.shutdown()
    return rows


def main() -> None:
    """Command line: print each way's median round time and its ratio to the in-process engine's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny", help="builtin:NAME or an HF directory")
    parser.add_argument("--batch", type=int, default=64, help="requests per round")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    rows = asyncio.run(measure(args))
    bound = rows[0][1]
    print(f"{args.batch} requests x {args.new_tokens} new tokens, {args.model}, median of {args.rounds} rounds")
    print(f"{'way':<18} {'ms / round':>10} {'x in-process':>13}")
    for name, seconds in rows:
        print(f"{name:<18} {seconds * 1e3:>10.1f} {seconds / bound:>13.2f}")


if __name__ == "__main__":
    main()
