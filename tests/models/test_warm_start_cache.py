"""Processes that start together on an empty cache build the warm start once, and none reads a half-written one."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from sc_lightning.models import warm_start as warm_start_module
from tests.conftest import RENDEZVOUS

pytestmark = pytest.mark.slow


def _resolve(cache: Path, builds: Path, start: multiprocessing.synchronize.Barrier, out: Path) -> None:
    """A process of the race: count this process's builds in ``builds``, resolve, load what it got."""
    from sc_lightning.models import load_policy

    for variable in RENDEZVOUS:  # inherited from a test process that set up torch.distributed (and holds its port)
        os.environ.pop(variable, None)

    build = warm_start_module.warm_start

    def counted(path: Path, **kwargs: object) -> float:
        with builds.open("a") as handle:
            handle.write(f"{path}\n")
        return build(path, **kwargs)

    warm_start_module.warm_start = counted
    start.wait(timeout=120)
    path = warm_start_module.resolve_model_name("builtin:tiny-arith", seed=5, cache_dir=cache)
    model, spec, _ = load_policy(path)  # fails on a directory whose weights are not all written yet
    out.write_text(f"{path} {sum(p.numel() for p in model.parameters())}")


def test_three_processes_on_an_empty_cache_build_the_warm_start_once(tmp_path: Path) -> None:
    """All three get the same whole model; one built it, the others waited for it."""
    cache, builds = tmp_path / "cache", tmp_path / "builds.txt"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(3)
    outs = [tmp_path / f"out{i}.txt" for i in range(3)]
    processes = [context.Process(target=_resolve, args=(cache, builds, start, out)) for out in outs]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=300)
        assert process.exitcode == 0, f"a resolving process failed (exit code {process.exitcode})"
    assert len(builds.read_text().splitlines()) == 1, builds.read_text()
    answers = {out.read_text() for out in outs}
    assert len(answers) == 1, answers
    path = Path(answers.pop().split()[0])
    assert path.parent == cache and (path / "model.safetensors").exists()
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [path.name]  # no staging left
