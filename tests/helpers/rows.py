"""Rows as the data plane holds them: random rows of any dtype, and exact comparisons of rows and columns."""

from __future__ import annotations

from typing import Any

import torch


def rand_rows(dtype: torch.dtype, lengths: list[int], trailing: tuple[int, ...] = (), seed: int = 0) -> list[Any]:
    """Rows of random values; ``lengths`` entries of -1 make 0-d rows."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for length in lengths:
        shape = () if length < 0 else (length, *trailing)
        values = torch.randint(-100, 100, shape, generator=gen)
        rows.append((values > 0) if dtype is torch.bool else values.to(dtype))
    return rows


def assert_rows_equal(got: list[torch.Tensor], want: list[torch.Tensor], field: str = "") -> None:
    """Each row of ``got`` is a tensor of the dtype, shape and values of ``want``'s (``field`` names them)."""
    assert len(got) == len(want), field
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        assert isinstance(g, torch.Tensor), (field, index)
        assert g.dtype == w.dtype, (field, index, g.dtype, w.dtype)
        assert g.shape == w.shape, (field, index, g.shape, w.shape)
        assert torch.equal(g, w), (field, index)


def assert_columns_equal(got: dict[str, list[torch.Tensor]], want: dict[str, list[torch.Tensor]]) -> None:
    """The same fields in the same order, each with rows equal to ``want``'s."""
    assert list(got) == list(want)
    for field in want:
        assert_rows_equal(got[field], want[field], field)


def sample_columns(n: int, seed: int = 0) -> dict[str, list[torch.Tensor]]:
    """A rollout-like row set: jagged per-token fields of several dtypes (including empty rows) and scalars."""
    lengths = [(seed * 7 + 5 * i) % 9 for i in range(n)]  # includes 0
    return {
        "input_ids": rand_rows(torch.int32, lengths, seed=seed),
        "logprobs": rand_rows(torch.float32, lengths, seed=seed + 1),
        "hidden": rand_rows(torch.bfloat16, lengths, (3,), seed=seed + 2),
        "token_mask": rand_rows(torch.int8, lengths, seed=seed + 3),
        "keep": rand_rows(torch.bool, lengths, seed=seed + 4),
        "reward": rand_rows(torch.float32, [-1] * n, seed=seed + 5),
        "length": [torch.tensor(length, dtype=torch.int32) for length in lengths],
        "truncated": rand_rows(torch.bool, [-1] * n, seed=seed + 6),
    }
