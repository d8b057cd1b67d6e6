"""Backend specifics outside the shared contract, none needing TransferQueue running: the memory plane's snapshots
and pickling, which backend the config builds, a lean package import and the Ray CPU check's message."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sc_lightning.config.runtime import DataPlaneConfig
from sc_lightning.data_plane import DataPlane, DataPlaneError, build_data_plane
from sc_lightning.data_plane.memory import MemoryDataPlane
from tests.helpers.configs import REPO
from tests.helpers.rows import assert_columns_equal, sample_columns


def test_load_into_a_fresh_memory_plane(tmp_path: Path) -> None:
    source = MemoryDataPlane("p")
    columns = sample_columns(5, seed=4)
    source.put([f"k{i}" for i in range(5)], columns, tags=[{"i": i} for i in range(5)])
    source.save(tmp_path)
    fresh = MemoryDataPlane("p")
    fresh.load(tmp_path)
    assert fresh.keys() == source.keys()
    assert fresh.tags(fresh.keys()) == source.tags(source.keys())
    assert_columns_equal(fresh.get(fresh.keys(), list(columns)), columns)
    assert (tmp_path / "manifest.json").exists()


def test_memory_load_over_capacity_keeps_contents(tmp_path: Path) -> None:
    big = MemoryDataPlane("p")
    big.put([f"k{i}" for i in range(5)], {"x": [torch.ones(1)] * 5})
    big.save(tmp_path)
    small = MemoryDataPlane("p", capacity=3)
    small.put(["mine"], {"x": [torch.zeros(1)]})
    with pytest.raises(DataPlaneError, match="capacity 3"):
        small.load(tmp_path)
    assert small.keys() == ["mine"]


def test_memory_plane_refuses_pickling() -> None:
    with pytest.raises(TypeError, match="lives in one process.*backend='simple'"):
        pickle.dumps(MemoryDataPlane())


def test_build_data_plane_picks_the_backend() -> None:
    plane = build_data_plane(DataPlaneConfig(backend="memory", partition_id="p", storage_capacity=7))
    assert isinstance(plane, MemoryDataPlane) and isinstance(plane, DataPlane)
    assert (plane.partition_id, plane.capacity) == ("p", 7)
    with pytest.raises(DataPlaneError, match="enabled is false"):
        build_data_plane(DataPlaneConfig(enabled=False, backend="memory"))


def test_importing_the_package_does_not_import_ray_or_transfer_queue() -> None:
    code = (
        "import sys, sc_lightning.data_plane, sc_lightning.data_plane.memory, sc_lightning.data_plane.transfer_queue;"
        "print(sorted(m for m in ('ray', 'transfer_queue', 'tensordict') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_check_ray_cpus_explains_the_shortage() -> None:
    from sc_lightning.data_plane.tq_runtime import check_ray_cpus

    check_ray_cpus({"CPU": 2.0}, 2)
    with pytest.raises(DataPlaneError, match=r"needs 3 free Ray CPUs .*has 1 free.*num_cpus"):
        check_ray_cpus({"CPU": 1.0}, 3)
