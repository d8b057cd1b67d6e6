"""The data-plane contract (docs/data-plane.md), run against every backend (the codec: test_codec.py).

``memory`` runs in-process. ``simple`` is real TransferQueue on a real local Ray: started once per module by the
``tq_owner`` fixture (about 10 s), each test on its own partition, everything shut down at the end.
One file, over 450 lines: one contract, whose clauses share the backend fixtures, and the three TransferQueue-only
checks at the end, which reuse the module's one TransferQueue start (another module would start it again);
backend specifics that need no running TransferQueue are in test_backend_specifics.py.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_lightning.data_plane import DataPlane, DataPlaneError, MissingRowsError
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.data_plane.snapshot_files import SnapshotFormatError
from tests.helpers.old_formats import as_version_1_snapshot, set_manifest_version
from tests.helpers.ray_head import in_shared_cluster, own_local_ray
from tests.helpers.rows import assert_columns_equal, assert_rows_equal, rand_rows, sample_columns
from tests.helpers.warm_cli import server_pids

# One pytest-xdist worker runs the whole module, so the module's TransferQueue starts once: the simple-backend tests
# reach ``tq_owner`` through ``request.getfixturevalue``, which the conftest's grouping by declared fixtures cannot see
# (two workers each started it, 70-90 s apiece on a loaded box).
pytestmark = pytest.mark.xdist_group("tests/data_plane/test_contract.py")

TQ_CAPACITY = 256
"""Rows the shared TransferQueue holds (all partitions together); the overflow tests fill it."""

BACKENDS = ["memory", pytest.param("simple", marks=pytest.mark.slow)]
_partitions = itertools.count()


# ---- fixtures --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tq_owner() -> Iterator[DataPlane]:
    """TransferQueue on a local Ray it starts itself (not the tests' shared cluster), started once for the module
    and shut down (Ray too) at its end."""
    import ray

    from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

    ray_was_running = ray.is_initialized()  # another module's fixture may hold a Ray; then TQ joins it
    with own_local_ray():
        owner = TransferQueueDataPlane("contract-owner", storage_capacity=TQ_CAPACITY, num_storage_units=1)
        assert owner.owns_transfer_queue
        yield owner
        owner.close()
    if not ray_was_running:  # we started Ray: close() stopped it, and its processes are gone
        assert not ray.is_initialized()
        assert_no_child_processes()


def assert_no_child_processes(timeout_s: float = 20.0) -> None:
    """Ray's GCS, raylet and workers (our children) are gone shortly after ``ray.shutdown``; the warm CLI's server
    (tests/helpers/warm_cli.py), which this process keeps for forking commands, and the tests' shared Ray cluster
    (tests/helpers/ray_head.py) are not this Ray's."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        kept = server_pids()
        children = [
            p for p in psutil.Process().children(recursive=True) if p.pid not in kept and not in_shared_cluster(p.pid)
        ]
        alive = [p for p in children if p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not alive, [" ".join(p.cmdline()[:2]) for p in alive]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_plane(request: pytest.FixtureRequest, backend: str) -> Iterator[Callable[..., DataPlane]]:
    """Factory of empty data planes on fresh partitions of the backend under test; cleans them up."""
    made: list[DataPlane] = []

    def make(capacity: int | None = None) -> DataPlane:
        partition = f"contract-{next(_partitions)}"
        if backend == "memory":
            plane: DataPlane = MemoryDataPlane(partition, capacity=capacity)
        else:
            request.getfixturevalue("tq_owner")
            from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

            plane = TransferQueueDataPlane(partition)  # attaches to the module's TransferQueue
            assert not plane.owns_transfer_queue
        made.append(plane)
        return plane

    yield make
    for plane in made:
        with contextlib.suppress(DataPlaneError):  # closed by the test
            plane.clear(plane.keys())
        plane.close()


@pytest.fixture
def plane(make_plane: Callable[..., DataPlane]) -> DataPlane:
    return make_plane()


def capacity_of(backend: str) -> int:
    return 6 if backend == "memory" else TQ_CAPACITY


# ---- helpers ---------------------------------------------------------------------------------------------------

DTYPES = [torch.int32, torch.float32, torch.bfloat16, torch.int8, torch.bool]


def pick(columns: dict[str, list[torch.Tensor]], indexes: list[int]) -> dict[str, list[torch.Tensor]]:
    return {field: [rows[i] for i in indexes] for field, rows in columns.items()}


# ---- reads and writes ------------------------------------------------------------------------------------------


def test_round_trip_keeps_key_order_dtypes_and_jagged_lengths(plane: DataPlane) -> None:
    keys = [f"row{i}" for i in range(10)]
    columns = sample_columns(10)
    plane.put(keys, columns)
    assert sorted(plane.keys()) == sorted(keys)

    order = [7, 2, 9, 0, 4]
    got = plane.get([keys[i] for i in order], list(columns))
    assert_columns_equal(got, pick(columns, order))
    for row in got["reward"] + got["length"] + got["truncated"]:
        assert row.dim() == 0  # per-row scalars come back 0-d


def test_packed_reads_hold_the_same_rows_in_one_buffer(plane: DataPlane) -> None:
    keys = [f"row{i}" for i in range(10)]
    columns = sample_columns(10)
    plane.put(keys, columns)
    order = [3, 8, 1, 5]
    packed = plane.get_packed([keys[i] for i in order], list(columns))
    assert_columns_equal({field: rows.rows() for field, rows in packed.items()}, pick(columns, order))
    assert packed["reward"].lengths is None  # per-row scalars stack to (N,)
    assert packed["input_ids"].lengths == [columns["input_ids"][i].shape[0] for i in order]
    with pytest.raises(MissingRowsError, match="nope"):
        plane.get_packed(["row0", "nope"], ["input_ids"])


def test_rows_from_several_puts_come_back_in_key_order(plane: DataPlane) -> None:
    first, second = sample_columns(4, seed=1), sample_columns(3, seed=2)
    plane.put(["a0", "a1", "a2", "a3"], first)
    plane.put(["b0", "b1", "b2"], second)
    got = plane.get(["b2", "a1", "a2", "b0", "a0"], ["input_ids", "reward"])
    want = {
        "input_ids": [second["input_ids"][2], *first["input_ids"][1:3], second["input_ids"][0], first["input_ids"][0]],
        "reward": [second["reward"][2], *first["reward"][1:3], second["reward"][0], first["reward"][0]],
    }
    assert_columns_equal(got, want)


def test_column_write_back_adds_and_replaces_only_the_written_field(plane: DataPlane) -> None:
    keys = ["g/0", "g/1", "g/2"]
    columns = sample_columns(3)
    plane.put(keys, {"input_ids": columns["input_ids"], "reward": columns["reward"]})
    advantages = [torch.full((len(row),), float(i)) for i, row in enumerate(columns["input_ids"])]
    plane.put(keys[::-1], {"advantages": advantages[::-1]})  # another order, another field
    new_reward = [torch.tensor(9.0), torch.tensor(8.0)]
    plane.put(keys[:2], {"reward": new_reward})

    got = plane.get(keys, ["input_ids", "advantages", "reward"])
    assert_rows_equal(got["input_ids"], columns["input_ids"])
    assert_rows_equal(got["advantages"], advantages)
    assert_rows_equal(got["reward"], [*new_reward, columns["reward"][2]])


def test_unknown_keys_raise_naming_them(plane: DataPlane) -> None:
    plane.put(["k0", "k1"], {"x": [torch.ones(2), torch.ones(3)]})
    with pytest.raises(MissingRowsError, match="nope") as info:
        plane.get(["k0", "nope", "k1"], ["x"])
    assert "k0" not in str(info.value)
    assert isinstance(info.value, KeyError) and isinstance(info.value, DataPlaneError)
    with pytest.raises(MissingRowsError, match=r"2 key\(s\) not stored.*'gone1', 'gone2'"):
        plane.get(["gone1", "gone2"], ["x"])
    with pytest.raises(MissingRowsError, match="nope"):
        plane.tags(["k0", "nope"])


def test_field_missing_on_some_rows_raises_naming_field_and_rows(plane: DataPlane) -> None:
    plane.put(["k0", "k1", "k2"], {"x": [torch.ones(1)] * 3})
    plane.put(["k1"], {"y": [torch.zeros(2)]})
    with pytest.raises(MissingRowsError, match=r"field 'y' missing on 2 row\(s\): \['k0', 'k2'\]") as info:
        plane.get(["k0", "k1", "k2"], ["x", "y"])
    assert "'k1'" not in str(info.value)
    with pytest.raises(MissingRowsError, match="field 'never_written'"):
        plane.get(["k1"], ["never_written"])
    assert_rows_equal(plane.get(["k1"], ["y"])["y"], [torch.zeros(2)])


def test_get_without_fields_still_checks_keys(plane: DataPlane) -> None:
    plane.put(["k0"], {"x": [torch.ones(1)]})
    assert plane.get(["k0"], []) == {}
    with pytest.raises(MissingRowsError, match="ghost"):
        plane.get(["k0", "ghost"], [])


def test_empty_key_lists(plane: DataPlane) -> None:
    plane.put([], {"x": []})
    plane.put([])
    assert plane.get([], ["x", "y"]) == {"x": [], "y": []}
    assert plane.tags([]) == []
    plane.clear([])
    assert plane.keys() == []


def test_bare_put_creates_rows_without_fields(plane: DataPlane) -> None:
    plane.put(["k0", "k1"])
    assert sorted(plane.keys()) == ["k0", "k1"]
    assert plane.tags(["k0", "k1"]) == [{}, {}]
    with pytest.raises(MissingRowsError, match="field 'x'"):
        plane.get(["k0"], ["x"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes_and_shapes_survive(plane: DataPlane, dtype: torch.dtype) -> None:
    columns = {
        "jagged": rand_rows(dtype, [3, 0, 5, 1]),
        "wide": rand_rows(dtype, [2, 4, 1, 3], (2, 3)),
        "uniform": rand_rows(dtype, [4, 4, 4, 4]),
        "scalar": rand_rows(dtype, [-1, -1, -1, -1]),
    }
    keys = ["a", "b", "c", "d"]
    plane.put(keys, columns)
    assert_columns_equal(plane.get(keys, list(columns)), columns)


def test_packed_columns_are_accepted(plane: DataPlane) -> None:
    ids = rand_rows(torch.int32, [3, 0, 2])
    dense = torch.arange(12, dtype=torch.int8).reshape(3, 4)
    nested = torch.nested.as_nested_tensor(ids, layout=torch.jagged)
    plane.put(["a", "b", "c"], {"ids": nested, "mask": dense, "reward": torch.tensor([1.0, 2.0, 3.0])})
    got = plane.get(["c", "a"], ["ids", "mask", "reward"])
    assert_rows_equal(got["ids"], [ids[2], ids[0]])
    assert_rows_equal(got["mask"], [dense[2], dense[0]])
    assert_rows_equal(got["reward"], [torch.tensor(3.0), torch.tensor(1.0)])
    dense.fill_(0)  # copied on put
    assert_rows_equal(plane.get(["b"], ["mask"])["mask"], [torch.arange(4, 8, dtype=torch.int8)])


def test_values_are_isolated_from_callers(plane: DataPlane) -> None:
    rows = [torch.arange(4, dtype=torch.int32), torch.arange(3, dtype=torch.int32)]
    scalars = [torch.tensor(1.0), torch.tensor(2.0)]
    plane.put(["a", "b"], {"ids": rows, "s": scalars})
    rows[0].fill_(-1)
    scalars[1].fill_(-1)
    got = plane.get(["a", "b"], ["ids", "s"])
    assert_rows_equal(got["ids"], [torch.arange(4, dtype=torch.int32), torch.arange(3, dtype=torch.int32)])
    got["ids"][1].fill_(7)
    got["s"][0].fill_(7)
    again = plane.get(["a", "b"], ["ids", "s"])
    assert_rows_equal(again["ids"], [torch.arange(4, dtype=torch.int32), torch.arange(3, dtype=torch.int32)])
    assert_rows_equal(again["s"], [torch.tensor(1.0), torch.tensor(2.0)])


# ---- tags and clear --------------------------------------------------------------------------------------------


def test_tags_merge_per_key_and_clear_removes_them(plane: DataPlane) -> None:
    keys = ["k0", "k1"]
    plane.put(keys, {"x": [torch.ones(1), torch.ones(2)]}, tags=[{"group": "g", "i": 0}, {"group": "g", "i": 1}])
    plane.put(keys, tags=[{"score": 0.5}, {}])  # tags only
    plane.put(["k1"], {"y": [torch.zeros(1)]}, tags=[{"i": 10, "done": True, "note": None}])
    assert plane.tags(keys) == [
        {"group": "g", "i": 0, "score": 0.5},
        {"group": "g", "i": 10, "done": True, "note": None},
    ]
    returned = plane.tags(["k0"])
    returned[0]["group"] = "changed"
    assert plane.tags(["k0"])[0]["group"] == "g"

    plane.clear(["k0"])
    assert plane.keys() == ["k1"]
    plane.put(["k0"], {"x": [torch.ones(3)]})
    assert plane.tags(["k0"]) == [{}]


def test_clear_is_idempotent_and_cleared_keys_raise(plane: DataPlane) -> None:
    plane.put(["k0", "k1", "k2"], {"x": [torch.ones(1)] * 3})
    plane.clear(["k0", "k2", "never"])
    plane.clear(["k0", "k2"])
    plane.clear(["k0", "k0"])
    assert plane.keys() == ["k1"]
    with pytest.raises(MissingRowsError, match="'k0'"):
        plane.get(["k0", "k1"], ["x"])
    assert_rows_equal(plane.get(["k1"], ["x"])["x"], [torch.ones(1)])
    plane.clear(plane.keys())
    assert plane.keys() == []


# ---- failures leave no trace -----------------------------------------------------------------------------------


def test_capacity_overflow_leaves_no_trace(make_plane: Callable[..., DataPlane], backend: str) -> None:
    capacity = capacity_of(backend)
    plane = make_plane(capacity=capacity)
    plane.put(["old0", "old1"], {"x": [torch.ones(1), torch.ones(2)]}, tags=[{"t": 0}, {"t": 1}])
    new = [f"new{i}" for i in range(capacity - 1)]
    keys = ["old1", *new]  # one existing key + capacity - 1 new ones: one row too many
    with pytest.raises(DataPlaneError) as info:
        plane.put(keys, {"x": [torch.zeros(1)] * len(keys)}, tags=[{"t": 9}] * len(keys))
    assert "capacity" in str(info.value)
    assert sorted(plane.keys()) == ["old0", "old1"]  # no orphan rows
    assert plane.tags(["old0", "old1"]) == [{"t": 0}, {"t": 1}]
    assert_rows_equal(plane.get(["old0", "old1"], ["x"])["x"], [torch.ones(1), torch.ones(2)])
    plane.put(new[:2], {"x": [torch.zeros(1)] * 2})  # and the store still works
    assert sorted(plane.keys()) == ["new0", "new1", "old0", "old1"]


@pytest.mark.parametrize(
    ("fields", "tags", "match"),
    [
        ({"x": [torch.ones(2), [1, 2]]}, None, r"field 'x': row 1 is a list, not a tensor"),
        ({"x": [torch.ones(2), "text"]}, None, r"field 'x': row 1 is a str"),
        ({"x": [torch.ones(2), torch.ones(2, dtype=torch.float64)]}, None, r"field 'x': row 1 has dtype"),
        ({"x": [torch.ones(2, 3), torch.ones(2, 4)]}, None, r"field 'x': row 1 has shape \(2, 4\)"),
        ({"x": [torch.ones(2), torch.tensor(1.0)]}, None, r"field 'x': row 1 has shape \(\)"),
        ({"x": [torch.tensor(1.0), torch.ones(1)]}, None, r"field 'x': row 1 has shape \(1,\)"),
        ({"x": [torch.ones(2)]}, None, r"field 'x' has 1 rows but 2 keys"),
        ({"x": "ab"}, None, r"field 'x': expected a sequence of tensors"),
        ({"x": [torch.ones(1)] * 2}, [{"t": [1]}, {}], r"tag 't' of row 0"),
        ({"x": [torch.ones(1)] * 2}, [{}], r"1 tag dicts given for 2 keys"),
    ],
)
def test_invalid_puts_are_rejected_before_anything_is_written(
    plane: DataPlane, fields: dict[str, Any], tags: list[dict[str, Any]] | None, match: str
) -> None:
    with pytest.raises(DataPlaneError, match=match):
        plane.put(["k0", "k1"], {"ok": [torch.ones(1), torch.ones(1)], **fields}, tags=tags)
    assert plane.keys() == []


def test_bad_key_lists_are_rejected(plane: DataPlane) -> None:
    with pytest.raises(DataPlaneError, match="repeated: \\['k0'\\]"):
        plane.put(["k0", "k1", "k0"], {"x": [torch.ones(1)] * 3})
    with pytest.raises(DataPlaneError, match="sequence of strings"):
        plane.get("k0", ["x"])
    with pytest.raises(DataPlaneError, match="sequence of field names"):
        plane.get(["k0"], "x")
    with pytest.raises(DataPlaneError, match="must be strings"):
        plane.put([1, 2], {"x": [torch.ones(1)] * 2})
    assert plane.keys() == []


# ---- snapshots -------------------------------------------------------------------------------------------------


def test_save_load_round_trip_replaces_contents(plane: DataPlane, tmp_path: Path) -> None:
    keys = [f"r{i}" for i in range(6)]
    columns = sample_columns(6, seed=3)
    plane.put(keys, columns, tags=[{"i": i, "group": f"g{i // 3}"} for i in range(6)])
    plane.put(keys[:2], {"advantages": [torch.ones(3), torch.ones(1)]})  # a field only some rows have
    plane.put(["bare"])
    plane.save(tmp_path / "snap")

    plane.clear(keys[3:])
    plane.put(["extra"], {"x": [torch.ones(1)]}, tags=[{"extra": True}])
    plane.put(keys[:1], tags=[{"i": 99}])
    plane.load(tmp_path / "snap")

    assert sorted(plane.keys()) == sorted([*keys, "bare"])
    assert plane.tags([*keys, "bare"]) == [*({"i": i, "group": f"g{i // 3}"} for i in range(6)), {}]
    assert_columns_equal(plane.get(keys, list(columns)), columns)
    assert_rows_equal(plane.get(keys[:2], ["advantages"])["advantages"], [torch.ones(3), torch.ones(1)])
    with pytest.raises(MissingRowsError, match="advantages"):
        plane.get(keys, ["advantages"])
    plane.put(["after"], {"x": [torch.ones(2)]})  # the loaded store keeps working
    assert_rows_equal(plane.get(["after"], ["x"])["x"], [torch.ones(2)])


def test_token_versions_of_rollout_rows_survive_the_plane_and_a_snapshot(plane: DataPlane, tmp_path: Path) -> None:
    """A group whose first completion spans a refit (versions 3, 3, 4): its rows' per-token versions come back
    through the backend's codec, a snapshot and the trainer's chunk loader, aligned with the tokens."""
    from sc_lightning.controller.api import GroupMeta
    from sc_lightning.controller.rows import group_to_columns
    from sc_lightning.trainer.chunks import load_chunk
    from sc_lightning.types import Generation, Prompt, ScoredGroup

    spanning = Generation((4, 1, 9), (-0.1, -0.2, -0.3), "length", 3, (3, 3, 4))
    group = ScoredGroup(Prompt("p", (2, 5, 7)), (spanning, Generation((6,), (-0.5,), "stop", 4)), (1.0, 0.0))
    keys, columns, tags = group_to_columns("g", group, start_weight=3, end_weight=4)
    plane.put(keys, columns, tags=tags)
    plane.save(tmp_path / "snap")
    plane.clear(keys)
    plane.load(tmp_path / "snap")
    meta = GroupMeta("g", "p", tuple(keys), (6, 4), start_weight=3, end_weight=4, target_step=None)
    chunk = load_chunk(
        plane, [meta], pad_token_id=0, overlong_filtering=False, leave_one_out=False, normalize_rewards=False
    )
    assert chunk.token_versions.tolist() == [[-1, -1, -1, 3, 3, 4], [-1, -1, -1, 4, -1, -1]]
    assert chunk.input_ids.tolist() == [[2, 5, 7, 4, 1, 9], [2, 5, 7, 6, 0, 0]]


def _image_rows(counts: list[int], size: int = 8, seed: int = 0) -> list[torch.Tensor]:
    """Per-image rows: ``counts[i]`` RGB uint8 images of ``size`` x ``size`` for row i (the full byte range)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (count, size, size, 3), generator=gen, dtype=torch.uint8) for count in counts]


def test_multi_dim_uint8_rows_survive_reads_packed_reads_and_a_snapshot(plane: DataPlane, tmp_path: Path) -> None:
    """Image rows, (num_images, H, W, 3) uint8 and jagged along the images (none in one row), come back exact."""
    keys, images = ["a", "b", "c", "d"], _image_rows([2, 1, 0, 3])
    plane.put(keys, {"pixel_values": images, "reward": torch.arange(4.0)})
    assert_rows_equal(plane.get(keys, ["pixel_values"])["pixel_values"], images)
    packed = plane.get_packed(["d", "a"], ["pixel_values"])["pixel_values"]
    assert packed.lengths == [3, 2] and packed.values.shape == (5, 8, 8, 3) and packed.values.dtype == torch.uint8
    assert torch.equal(packed.values, torch.cat([images[3], images[0]]))
    plane.save(tmp_path / "snap")
    plane.clear(keys)
    plane.load(tmp_path / "snap")
    assert_rows_equal(
        plane.get(["c", "b", "d", "a"], ["pixel_values"])["pixel_values"], [images[i] for i in (2, 1, 3, 0)]
    )


def test_a_prompts_images_reach_the_trainers_chunk_through_a_snapshot(plane: DataPlane, tmp_path: Path) -> None:
    """Rows committed from a prompt with images hold its pixels (every generation's row), a snapshot keeps them,
    and the chunk loader reads them only when asked; a text group's rows have no pixel_values at all."""
    from sc_lightning.controller.api import GroupMeta
    from sc_lightning.controller.rows import group_to_columns
    from sc_lightning.rollout.images import images_tensor
    from sc_lightning.trainer.chunks import load_chunk
    from sc_lightning.types import Generation, Prompt, PromptImage, ScoredGroup

    pixels = _image_rows([2], size=4, seed=1)[0]
    images = tuple(PromptImage(4, 4, image.numpy().tobytes()) for image in pixels)
    answers = (Generation((4, 1), (-0.1, -0.2), "stop", 3), Generation((6,), (-0.5,), "stop", 3))
    seen = ScoredGroup(Prompt("p", (2, 18, 18, 5), images=images), answers, (1.0, 0.0))
    text = ScoredGroup(Prompt("t", (2, 5)), answers, (0.0, 1.0))
    keys, columns, tags = group_to_columns("g", seen, start_weight=3, end_weight=3)
    text_keys, text_columns, text_tags = group_to_columns("h", text, start_weight=3, end_weight=3)
    assert "pixel_values" not in text_columns
    plane.put(keys, columns, tags=tags)
    plane.put(text_keys, text_columns, tags=text_tags)
    plane.save(tmp_path / "snap")
    plane.clear([*keys, *text_keys])
    plane.load(tmp_path / "snap")
    meta = GroupMeta("g", "p", tuple(keys), (6, 5), start_weight=3, end_weight=3, target_step=None)
    settings = {"pad_token_id": 0, "overlong_filtering": False, "leave_one_out": False, "normalize_rewards": False}
    chunk = load_chunk(plane, [meta], with_images=True, **settings)
    assert [row.tolist() for row in chunk.pixel_values] == [images_tensor(images).tolist()] * 2
    assert load_chunk(plane, [meta], **settings).pixel_values is None
    text_meta = GroupMeta("h", "t", tuple(text_keys), (4, 3), start_weight=3, end_weight=3, target_step=None)
    assert load_chunk(plane, [text_meta], **settings).input_ids.tolist() == [[2, 5, 4, 1], [2, 5, 6, 0]]
    with pytest.raises(MissingRowsError, match="pixel_values"):
        load_chunk(plane, [meta, text_meta], with_images=True, **settings)


def _group_rows(plane: DataPlane) -> tuple[list[str], dict[str, list[torch.Tensor]]]:
    """Put one scored group's trained rows (a completion spanning versions 3 and 4, another of version 4) into
    ``plane``; returns their keys and columns."""
    from sc_lightning.controller.rows import group_to_columns
    from sc_lightning.types import Generation, Prompt, ScoredGroup

    spanning = Generation((4, 1, 9), (-0.1, -0.2, -0.3), "length", 3, (3, 3, 4))
    group = ScoredGroup(Prompt("p", (2, 5, 7)), (spanning, Generation((6,), (-0.5,), "stop", 4)), (1.0, 0.0))
    keys, columns, tags = group_to_columns("g", group, start_weight=3, end_weight=4)
    plane.put(keys, columns, tags=tags)
    return keys, columns


def test_a_version_1_snapshot_without_token_versions_is_upgraded_on_load(plane: DataPlane, tmp_path: Path) -> None:
    """Rows from before per-token versions get their group's start version on every completion token, -1 on the
    prompt (what training used for them then); every other field comes back as saved."""
    source = MemoryDataPlane(plane.partition_id)
    keys, columns = _group_rows(source)
    source.save(tmp_path / "snap")
    as_version_1_snapshot(tmp_path / "snap")
    plane.load(tmp_path / "snap")
    got = plane.get(keys, ["token_versions", "input_ids"])
    assert [row.tolist() for row in got["token_versions"]] == [[-1, -1, -1, 3, 3, 3], [-1, -1, -1, 3]]
    assert got["token_versions"][0].dtype == columns["token_versions"][0].dtype
    assert_rows_equal(got["input_ids"], columns["input_ids"])


def test_a_version_1_snapshot_that_cannot_be_upgraded_names_what_is_missing(plane: DataPlane, tmp_path: Path) -> None:
    source = MemoryDataPlane(plane.partition_id)
    keys, _ = _group_rows(source)
    source.save(tmp_path / "snap")
    as_version_1_snapshot(tmp_path / "snap", drop_fields=("token_versions", "prompt_lengths"))
    plane.put(["kept"], {"x": [torch.ones(1)]})
    with pytest.raises(SnapshotFormatError, match="format version 1.*no token_versions.*prompt_lengths"):
        plane.load(tmp_path / "snap")
    if isinstance(plane, MemoryDataPlane):  # the memory plane's load is all-or-nothing
        assert plane.keys() == ["kept"]


def test_a_snapshot_of_a_newer_version_is_refused_naming_it(plane: DataPlane, tmp_path: Path) -> None:
    source = MemoryDataPlane(plane.partition_id)
    _group_rows(source)
    source.save(tmp_path / "snap")
    set_manifest_version(tmp_path / "snap", 9)
    with pytest.raises(SnapshotFormatError, match="format version 9; this sc_lightning reads versions 1, 2"):
        plane.load(tmp_path / "snap")


def test_load_refuses_another_partition_and_missing_snapshots(plane: DataPlane, tmp_path: Path) -> None:
    other = MemoryDataPlane("some-other-partition")
    other.put(["k"], {"x": [torch.ones(1)]})
    other.save(tmp_path / "other")
    with pytest.raises(DataPlaneError, match="some-other-partition"):
        plane.load(tmp_path / "other")
    with pytest.raises(DataPlaneError, match="no data-plane snapshot"):
        plane.load(tmp_path / "nothing-here")


# ---- concurrency -----------------------------------------------------------------------------------------------


def test_concurrent_writers_readers_and_clears_do_not_corrupt(plane: DataPlane) -> None:
    errors: list[BaseException] = []

    def worker(worker_id: int) -> None:
        rng = random.Random(worker_id)
        try:
            for step in range(8):
                keys = [f"w{worker_id}/s{step}/{i}" for i in range(4)]
                rows = [torch.full((rng.randint(1, 6),), worker_id * 100 + step, dtype=torch.int32) for _ in keys]
                plane.put(keys, {"x": rows}, tags=[{"w": worker_id}] * 4)
                got = plane.get(keys[::-1], ["x"])["x"]
                assert_rows_equal(got, rows[::-1])
                assert plane.tags(keys) == [{"w": worker_id}] * 4
                plane.clear(keys[:2])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[0]
    assert len(plane.keys()) == 4 * 8 * 2


# ---- backend specifics -----------------------------------------------------------------------------------------


def test_closed_plane_refuses_use(make_plane: Callable[..., DataPlane]) -> None:
    plane = make_plane()
    plane.close()
    plane.close()
    with pytest.raises(DataPlaneError, match="closed"):
        plane.put(["k"], {"x": [torch.ones(1)]})


@pytest.mark.slow
def test_tq_plane_is_picklable_and_attaches_inside_a_ray_actor(tq_owner: DataPlane) -> None:
    import ray

    from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

    plane = TransferQueueDataPlane("contract-actor")
    keys = ["a", "b"]
    plane.put(keys, {"ids": [torch.arange(3, dtype=torch.int32), torch.arange(5, dtype=torch.int32)]})

    @ray.remote(num_cpus=0)
    def write_back(remote_plane: TransferQueueDataPlane) -> tuple[list[int], list[bool]]:
        at_start = ["tensordict" in sys.modules, "torch._dynamo" in sys.modules]
        ids = remote_plane.get(["a", "b"], ["ids"])["ids"]
        remote_plane.put(["b", "a"], {"doubled": [ids[1] * 2, ids[0] * 2]}, tags=[{"by": "actor"}] * 2)
        remote_plane.close()  # not the owner: leaves TransferQueue running
        return [len(row) for row in ids], at_start

    lengths, at_start = ray.get(write_back.remote(plane), timeout=120)
    assert lengths == [3, 5]
    assert at_start == [True, False]  # the job's workers start with tensordict, without TorchDynamo (lean_tensordict)
    got = plane.get(keys, ["doubled"])["doubled"]
    assert_rows_equal(got, [torch.arange(3, dtype=torch.int32) * 2, torch.arange(5, dtype=torch.int32) * 2])
    assert plane.tags(keys) == [{"by": "actor"}] * 2
    plane.clear(keys)
    plane.close()


@pytest.mark.slow
def test_tq_started_with_polling_mode_and_thread_count(tq_owner: DataPlane) -> None:
    import os

    import ray

    from sc_lightning.data_plane.tq_runtime import CONTROLLER_ACTOR, CONTROLLER_NAMESPACE, cpu_cores

    controller = ray.get_actor(CONTROLLER_ACTOR, namespace=CONTROLLER_NAMESPACE)
    config = ray.get(controller.get_config.remote(), timeout=60)
    assert config.controller.polling_mode is True
    assert config.backend.SimpleStorage.total_storage_size == TQ_CAPACITY
    assert os.environ["TQ_NUM_THREADS"] == str(cpu_cores())


@pytest.mark.slow
def test_memory_snapshot_loads_into_transfer_queue(tq_owner: DataPlane, tmp_path: Path) -> None:
    from sc_lightning.data_plane.transfer_queue import TransferQueueDataPlane

    source = MemoryDataPlane("contract-neutral")
    columns = sample_columns(4, seed=5)
    source.put(["k0", "k1", "k2", "k3"], columns, tags=[{"i": i} for i in range(4)])
    source.put(["k1"], {"extra": [torch.ones(2, dtype=torch.int8)]})
    source.save(tmp_path)
    plane = TransferQueueDataPlane("contract-neutral")
    plane.put(["stale"], {"x": [torch.ones(1)]})
    plane.load(tmp_path)
    assert sorted(plane.keys()) == ["k0", "k1", "k2", "k3"]
    assert plane.tags(["k0", "k3"]) == [{"i": 0}, {"i": 3}]
    assert_columns_equal(plane.get(["k0", "k1", "k2", "k3"], list(columns)), columns)
    assert_rows_equal(plane.get(["k1"], ["extra"])["extra"], [torch.ones(2, dtype=torch.int8)])
    plane.clear(plane.keys())
    plane.close()
