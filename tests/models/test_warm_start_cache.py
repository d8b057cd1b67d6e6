"""The warm-start cache: a warm start appears whole or not at all, also when two runs build it at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sc_lightning.models import warm_start as warm_start_module
from sc_lightning.models.warm_start import resolve_model_name


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
