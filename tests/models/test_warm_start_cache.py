"""The warm-start cache: a warm start appears whole or not at all, also when runs, processes or the ranks of a
tensor-parallel group build it at once."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from sc_lightning.models import warm_start as warm_start_module
from sc_lightning.models.logprobs import token_logprobs
from sc_lightning.models.megatron import load_policy
from sc_lightning.models.warm_start import resolve_model_name
from tests.helpers.cli import user_environment
from tests.helpers.configs import REPO
from tests.models.warm_race import race_rank, resolve_then_split_rank
from tests.ranks import run_ranks


def test_two_runs_building_the_same_warm_start_at_once_publish_one_whole_directory(monkeypatch, tmp_path) -> None:
    """Both builders are mid-write together (a barrier); neither's half-written files are ever at the cached path,
    both get that path, it holds one builder's whole directory, and no build directory is left behind."""
    both_building = threading.Barrier(2, timeout=30)
    seen_half_written: list[bool] = []

    def slow_build(path: Path, **_: object) -> float:  # a fake warm start: two files, written one after the other
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text("{}")
        both_building.wait()
        cached = [d for d in (tmp_path / "cache").iterdir() if ".building-" not in d.name]
        seen_half_written.append(any(not (d / "model.safetensors").exists() for d in cached))
        (path / "model.safetensors").write_text("weights")
        return 0.4

    monkeypatch.setattr(warm_start_module, "warm_start", slow_build)
    results: list[str] = []
    runs = [
        threading.Thread(
            target=lambda: results.append(
                resolve_model_name("builtin:tiny-arith", seed=7, cache_dir=tmp_path / "cache")
            )
        )
        for _ in range(2)
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=60)
    assert len(results) == 2 and results[0] == results[1]
    assert seen_half_written == [False, False]
    published = Path(results[0])
    assert sorted(p.name for p in published.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [published.name]


def test_a_build_that_fails_leaves_nothing_behind(monkeypatch, tmp_path) -> None:
    """A warm start that raises publishes nothing and leaves no build directory: the next run builds it again instead
    of loading a broken one."""

    def failing_build(path: Path, **_: object) -> float:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text("{}")
        raise RuntimeError("out of memory")

    monkeypatch.setattr(warm_start_module, "warm_start", failing_build)
    with pytest.raises(RuntimeError, match="out of memory"):
        resolve_model_name("builtin:tiny-arith", seed=7, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_local_directories_and_warm_starts_resolve_to_absolute_paths(monkeypatch, tmp_path) -> None:
    """An engine in another process (a Ray actor on a cluster started elsewhere) does not share the driver's working
    directory: a relative local model directory and a relative cache come back absolute; hub and built-in names as
    they were."""

    def build(path: Path, **_: object) -> float:  # a fake warm start: its building directory stays empty
        return 0.4

    monkeypatch.setattr(warm_start_module, "warm_start", build)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_model").mkdir()
    assert resolve_model_name("my_model", seed=0) == str(tmp_path / "my_model")
    warm = resolve_model_name("builtin:tiny-arith", seed=7, cache_dir=Path("cache"))
    assert Path(warm).is_absolute() and Path(warm).parent == tmp_path / "cache"
    assert resolve_model_name("org/not-here", seed=0) == "org/not-here"
    assert resolve_model_name("builtin:tiny", seed=0) == "builtin:tiny"


def _published(cache: Path) -> Path:
    """The one entry of ``cache`` after a race: the published warm start, nothing left half built."""
    (entry,) = cache.iterdir()
    assert ".building-" not in entry.name and (entry / "config.json").is_file()
    return entry


@pytest.mark.slow
def test_three_processes_racing_on_an_empty_cache_all_load_one_complete_model(tmp_path) -> None:
    """Three processes build the same warm start at once (each holds its publishing step until all three have
    built: tests/models/warm_race.py), race to move it into place, and each loads the one published model."""
    cache, ready, out = tmp_path / "cache", tmp_path / "ready", tmp_path / "out"
    for folder in (cache, ready, out):
        folder.mkdir()
    command = [sys.executable, "-m", "tests.models.warm_race", str(cache), str(ready), "3", str(out)]
    racers = [subprocess.Popen(command, cwd=REPO, env=user_environment(), stderr=subprocess.PIPE) for _ in range(3)]
    for racer in racers:
        _, err = racer.communicate(timeout=240)
        assert racer.returncode == 0, err.decode()[-3000:]
    assert len(list(ready.iterdir())) == 3  # all three built before any published
    results = [torch.load(path) for path in sorted(out.iterdir())]
    published = _published(cache)
    assert {r["path"] for r in results} == {str(published)}
    for result in results[1:]:
        assert torch.equal(result["logprobs"], results[0]["logprobs"])


@pytest.mark.slow
def test_a_tensor_parallel_group_building_together_loads_one_complete_model(tmp_path) -> None:
    """Both ranks of a TP=2 group build the warm start at once and race to publish it; both load their shard of the
    published model, and together they score a batch as one process does (the whole model, not half of one)."""
    cache, ready, out = tmp_path / "cache", tmp_path / "ready", tmp_path / "out"
    for folder in (cache, ready, out):
        folder.mkdir()
    run_ranks(race_rank, 2, cache, ready, out)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    published = _published(cache)
    assert ranks[0]["path"] == ranks[1]["path"] == str(published)
    assert len(list(ready.iterdir())) == 2
    model, _, _ = load_policy(str(published), precision="fp32", seed=3)
    with torch.no_grad():
        alone = token_logprobs(model, torch.arange(2, 18).remainder(16).add(2).reshape(2, 8))
    torch.testing.assert_close(ranks[0]["logprobs"], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_a_rank_resolving_before_its_layout_is_set_can_still_split_the_policy(tmp_path, world: int) -> None:
    """A run's ranks resolve their warm start before megatron's parallel state is set (the policy sets it): building
    the warm start leaves it unset, so each rank then loads the policy at TP=``world`` — in a process of its own the
    build runs in place and tears its state down, on one rank of two in a fresh interpreter."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    for folder in (cache, out):
        folder.mkdir()
    run_ranks(resolve_then_split_rank, world, cache, out)
    published = _published(cache)
    model, _, _ = load_policy(str(published), precision="fp32", seed=3)
    with torch.no_grad():
        alone = token_logprobs(model, torch.arange(2, 18).remainder(16).add(2).reshape(2, 8))
    for rank in range(world):
        got = torch.load(out / f"rank{rank}.pt")
        assert got["path"] == str(published)
        torch.testing.assert_close(got["logprobs"], alone, rtol=1e-5, atol=1e-5)
