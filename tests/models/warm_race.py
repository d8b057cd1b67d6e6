"""A racer of the warm-start cache tests: build (or find) a warm start in a shared cache, load it, report what it got.

``python -m tests.models.warm_race CACHE READY RACERS OUT`` in a process of its own, or :func:`race_rank` on a rank
of a TP=2 group (``tests.ranks.run_ranks``). Each racer builds the same warm start through the real
:func:`~sc_lightning.models.warm_start.resolve_model_name`: a process of its own a small worked-arithmetic one
(``builtin:race-worked``: the tiny model, a budget of a few steps), a TP=2 rank ``builtin:tiny-arith`` (which it
builds in a fresh interpreter, its parallel state being split). Only its publishing step first waits, under a
deadline, until every racer has finished building (a marker each in ``READY``), so all of them race to move their
directory into place. Then it loads the published model (at the group's TP) and writes the path and the model's
log-probs of a fixed batch to ``OUT``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

RACE = "builtin:race-worked"


def _register_recipe() -> None:
    """The race's warm start: the tiny model with a long enough context, trained for a few steps."""
    from sc_lightning.models.spec import BUILTIN_SPECS, builtin_spec
    from sc_lightning.models.warm_start import WARM_STARTS, WarmRecipe
    from sc_lightning.models.warm_worked import WorkedBudget

    BUILTIN_SPECS["builtin:tiny-long"] = builtin_spec("builtin:tiny").replace(max_position_embeddings=2304)
    budget = WorkedBudget(max_tokens=4096, batch_tokens=2100, warmup_steps=1, held_out=2, target_reward=0.9, pool=16)
    WARM_STARTS[RACE] = WarmRecipe("builtin:tiny-long", lr=1e-3, check_every=1, task="worked_arithmetic", budget=budget)


def _publish_when_all_built(ready: Path, racers: int) -> None:
    """Hold every racer's publishing step until ``racers`` markers are in ``ready`` (60 s deadline)."""
    from sc_lightning.models import warm_start

    publish = warm_start._publish

    def held(building: Path, path: Path) -> None:
        (ready / f"{os.getpid()}.built").touch()
        deadline = time.monotonic() + 60
        while len(list(ready.glob("*.built"))) < racers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(list(ready.glob('*.built')))} of {racers} racers built a warm start")
            time.sleep(0.01)
        publish(building, path)

    warm_start._publish = held


def race(cache: Path, ready: Path, racers: int, name: str = RACE, tp: int = 1) -> dict[str, object]:
    """Resolve the warm start ``name`` in ``cache`` and load it at TP ``tp``: its path and log-probs of a fixed
    batch."""
    from sc_lightning.models.logprobs import token_logprobs
    from sc_lightning.models.megatron import load_policy
    from sc_lightning.models.warm_start import resolve_model_name

    _register_recipe()
    _publish_when_all_built(ready, racers)
    path = resolve_model_name(name, seed=3, cache_dir=cache)
    model, _, _ = load_policy(path, precision="fp32", seed=3, tp=tp)
    ids = torch.arange(2, 18).remainder(16).add(2).reshape(2, 8)
    with torch.no_grad():
        logprobs = token_logprobs(model, ids)
    return {"path": path, "logprobs": logprobs}


def race_rank(rank: int, world: int, cache: Path, ready: Path, out: Path) -> None:
    """One rank of a TP=``world`` group racing with its peers: each rank builds ``builtin:tiny-arith``, then loads its
    shard of the published one."""
    from sc_lightning.models.megatron import init_model_parallel

    init_model_parallel(world)
    torch.save(race(cache, ready, world, "builtin:tiny-arith", tp=world), out / f"rank{rank}.pt")


def resolve_then_split_rank(rank: int, world: int, cache: Path, out: Path) -> None:
    """One rank of ``world`` resolving ``builtin:tiny-arith`` on an empty cache before its parallel state is set, as a
    run's rank does; then it loads the warm start at TP=``world`` and writes what it got to ``out``."""
    from megatron.core import parallel_state

    from sc_lightning.models.logprobs import token_logprobs
    from sc_lightning.models.megatron import load_policy
    from sc_lightning.models.warm_start import resolve_model_name

    path = resolve_model_name("builtin:tiny-arith", seed=3, cache_dir=cache)
    assert not parallel_state.model_parallel_is_initialized(), "resolving the warm start set the parallel state"
    model, _, _ = load_policy(path, precision="fp32", seed=3, tp=world)
    with torch.no_grad():
        logprobs = token_logprobs(model, torch.arange(2, 18).remainder(16).add(2).reshape(2, 8))
    torch.save({"path": path, "logprobs": logprobs}, out / f"rank{rank}.pt")


def main(argv: list[str]) -> None:
    """One racer in a process of its own: ``CACHE READY RACERS OUT``."""
    cache, ready, racers, out = Path(argv[0]), Path(argv[1]), int(argv[2]), Path(argv[3])
    from sc_lightning.models.megatron import init_model_parallel

    init_model_parallel(1)
    torch.save(race(cache, ready, racers), out / f"racer{os.getpid()}.pt")


if __name__ == "__main__":
    main(sys.argv[1:])
