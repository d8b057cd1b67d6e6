"""Per-group controller overhead: dispatch → (instant) generate → score → commit → select → refit.

The engine is the FAKE ScriptedEngine answering instantly, so every microsecond measured is controller, buffer,
sampler, permits, environment and data-plane work. Three homes for the controller, in one run:
  in-process   the train side awaits the controller on the same event loop
  thread       LocalController: the train side calls from another thread (one hop per select)
  ray          RayController (benchmarks/ray_controller.py): the controller in a Ray actor (one RPC per call)
Target (benchmarks/README.md, "Controller overhead"): <= 1 ms per group in process.

    python benchmarks/controller_overhead.py [--groups 2048] [--per-step 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from ray_controller import RayController  # benchmarks/ray_controller.py (the script's folder is on sys.path)

from sc_lightning.config import load_config
from sc_lightning.controller.build import build_controller
from sc_lightning.controller.runners import LocalController
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.datasets import ArithmeticDataset
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.tokenizer import CharTokenizer


def make_builder(groups: int, per_step: int):
    """A zero-argument controller factory: windowed sampler, generous buffer, `groups` prompts in one epoch."""

    def build():
        tokenizer = CharTokenizer()
        config = load_config(
            {
                "grpo": {"num_prompts_per_step": per_step, "num_generations_per_prompt": 4, "seed": 0},
                "policy": {"train_global_batch_size": per_step * 4, "generation": {"max_new_tokens": 2}},
                "async_rl": {
                    "sampler": {"name": "windowed", "max_staleness_versions": 1000},
                    "max_buffered_rollouts": 4 * per_step,
                    "min_groups_for_streaming_train": 1,
                },
                "data_plane": {"backend": "memory"},
            }
        )
        return build_controller(
            config,
            data_plane=MemoryDataPlane(),
            engine=ScriptedEngine(),
            environment=ArithmeticEnvironment(),
            tokenizer=tokenizer,
            dataset=ArithmeticDataset(groups, 0, tokenizer),
        )

    return build


def drain_sync(client, groups: int, per_step: int) -> float:
    """Train side over a blocking client: select up to a step's groups at a time until `groups` are consumed."""
    started, consumed, version = time.perf_counter(), 0, 0
    while consumed < groups:
        chunk = client.select(version, 1, per_step, timeout_s=120)
        if chunk is None:
            break
        version += 1
        client.refit(version, None)  # releases the chunk's rows; no weights to push
        consumed += len(chunk)
    elapsed = time.perf_counter() - started
    client.shutdown()
    assert consumed == groups, f"consumed {consumed} of {groups}"
    return elapsed


async def drain_in_process(build, groups: int, per_step: int) -> float:
    """Train side on the controller's own event loop."""
    controller = build()
    started, consumed, version = time.perf_counter(), 0, 0
    await controller.start()
    while consumed < groups:
        chunk = await controller.select(version, 1, per_step, timeout_s=120)
        if chunk is None:
            break
        version += 1
        await controller.refit(version, None)
        consumed += len(chunk)
    elapsed = time.perf_counter() - started
    await controller.shutdown()
    assert consumed == groups, f"consumed {consumed} of {groups}"
    return elapsed


def main() -> None:
    """Run each home a few times and print the median per-group overhead."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=2048)
    parser.add_argument("--per-step", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    build = make_builder(args.groups, args.per_step)
    homes = {
        "in-process": lambda: asyncio.run(drain_in_process(build, args.groups, args.per_step)),
        "thread": lambda: drain_sync(LocalController(build), args.groups, args.per_step),
    }
    if not args.skip_ray:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        homes["ray"] = lambda: drain_sync(RayController(build), args.groups, args.per_step)
    print(f"{args.groups} groups x 4 generations, instant FAKE engine, memory data plane, median of {args.reps}")
    for name, run in homes.items():
        per_group_ms = statistics.median(run() for _ in range(args.reps)) / args.groups * 1e3
        print(f"  {name:<11} {per_group_ms:7.3f} ms/group   target <= 1 ms (in process): {per_group_ms <= 1.0}")


if __name__ == "__main__":
    main()
