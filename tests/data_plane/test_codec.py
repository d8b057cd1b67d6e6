"""The row codec: our column form <-> TransferQueue's wire form, padding helpers, and a round-trip property."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.data_plane import DataPlaneError
from sc_lightning.data_plane.base import pad_rows
from sc_lightning.data_plane.codec import pack_rows, row_lengths
from sc_lightning.data_plane.wire import from_wire, to_wire
from tests.helpers.rows import assert_columns_equal, assert_rows_equal, rand_rows

# ---- codec -----------------------------------------------------------------------------------------------------


def test_wire_form_is_dense_for_scalars_and_jagged_otherwise() -> None:
    columns = {"ids": rand_rows(torch.int32, [2, 0, 3]), "s": rand_rows(torch.float32, [-1, -1, -1])}
    wire = to_wire(columns, 3)
    assert wire.batch_size == torch.Size([3])
    assert not wire["s"].is_nested and wire["s"].shape == (3,)
    assert wire["ids"].is_nested and wire["ids"].layout is torch.jagged
    assert wire["ids"].offsets().tolist() == [0, 2, 2, 5]
    assert_columns_equal(from_wire(wire), columns)


def test_from_wire_accepts_dense_uniform_columns() -> None:
    dense = {"x": torch.arange(6).reshape(3, 2), "s": torch.tensor([1.0, 2.0, 3.0])}
    got = from_wire(dense, ["x", "s"])
    assert_rows_equal(got["x"], [torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5])])
    assert [row.dim() for row in got["s"]] == [0, 0, 0]


def test_pack_rows_accepts_dense_and_nested_columns() -> None:
    dense = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    assert_rows_equal(pack_rows("d", dense, 2).rows(), list(dense.unbind(0)))
    rows = rand_rows(torch.float32, [2, 5])
    nested = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    assert_rows_equal(pack_rows("n", nested, 2).rows(), rows)
    with pytest.raises(DataPlaneError, match="'d' has 2 rows but 3 keys"):
        pack_rows("d", dense, 3)


def test_pad_rows_and_row_lengths() -> None:
    rows = [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([], dtype=torch.int64)]
    assert torch.equal(pad_rows(rows, pad_value=-1), torch.tensor([[1, 2, 3], [4, -1, -1], [-1, -1, -1]]))
    assert torch.equal(row_lengths(rows), torch.tensor([3, 1, 0]))
    wide = [torch.ones(2, 2), torch.ones(1, 2)]
    assert pad_rows(wide).shape == (2, 2, 2) and pad_rows(wide)[1, 1].tolist() == [0.0, 0.0]
    assert torch.equal(pad_rows([torch.tensor(1.0), torch.tensor(2.0)]), torch.tensor([1.0, 2.0]))
    with pytest.raises(DataPlaneError, match="row 1 is a 0-d tensor"):
        row_lengths([torch.ones(1), torch.tensor(1.0)])


HYPOTHESIS_DTYPES = [torch.int32, torch.int64, torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.bool]


@st.composite
def jagged_columns(draw: st.DrawFn) -> tuple[int, dict[str, list[torch.Tensor]]]:
    num_rows = draw(st.integers(1, 6))
    columns = {}
    for index in range(draw(st.integers(1, 4))):
        dtype = draw(st.sampled_from(HYPOTHESIS_DTYPES))
        scalar = draw(st.booleans())
        trailing = draw(st.sampled_from([(), (1,), (2,), (2, 3)]))
        lengths = [-1] * num_rows if scalar else draw(st.lists(st.integers(0, 7), min_size=num_rows, max_size=num_rows))
        columns[f"f{index}"] = rand_rows(dtype, lengths, trailing, seed=draw(st.integers(0, 2**16)))
    return num_rows, columns


@settings(max_examples=150, deadline=None)
@given(jagged_columns())
def test_codec_round_trip_property(case: tuple[int, dict[str, list[torch.Tensor]]]) -> None:
    num_rows, columns = case
    assert_columns_equal(from_wire(to_wire(columns, num_rows)), columns)
    for field, rows in columns.items():
        assert_rows_equal(pack_rows(field, rows, num_rows).rows(), rows, field)
        padded = pad_rows(rows, pad_value=0)
        if rows[0].dim() == 0:
            assert torch.equal(padded, torch.stack(rows))
            continue
        assert row_lengths(rows).tolist() == [len(row) for row in rows]
        for index, row in enumerate(rows):
            assert torch.equal(padded[index, : len(row)], row)
            assert not padded[index, len(row) :].any()
