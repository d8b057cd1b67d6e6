"""Micro-batches with little padding: rows sorted by length, cut by a row count and a token budget.

A chunk's rows are right-padded to its longest row. Attention is causal, so a row's loss terms only see positions up
to its last valid (loss-counted) token: each row *needs* ``last valid position + 1`` columns, and a row with no valid
token needs none (it adds nothing to the loss or to any metric, so it is not run at all). :func:`plan_microbatches`
sorts the rows that need columns by that length, longest first, and cuts the sorted list into micro-batches of at
most ``max_rows`` rows whose padded size (rows x the longest row in it) stays within ``max_tokens``; each micro-batch
is then trimmed to its own longest row. A row longer than the budget gets a micro-batch of its own. The gradient is a
sum over rows, so the order and grouping change nothing but floating-point summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MicroBatchPlan:
    """One micro-batch: which rows of the chunk (``rows``), each one's needed length, the columns run (``width``)."""

    rows: list[int]
    lengths: list[int]

    @property
    def width(self) -> int:
        """The micro-batch's columns: its longest row's length."""
        return max(self.lengths)

    @property
    def padded_tokens(self) -> int:
        """The tokens the forward pass runs: rows x width."""
        return len(self.rows) * self.width


def needed_widths(mask: torch.Tensor) -> list[int]:
    """Per row of a (B, T) loss mask: its last valid position + 1, or 0 without any valid token (one host read)."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.bool() * positions).amax(dim=1).tolist()


def plan_microbatches(widths: list[int], *, max_rows: int, max_tokens: int | None = None) -> list[MicroBatchPlan]:
    """Group the rows with ``widths[i] > 0`` into micro-batches (longest rows first; see the module docstring)."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    order = sorted((i for i, width in enumerate(widths) if width > 0), key=lambda i: -widths[i])
    groups: list[list[int]] = []
    for i in order:
        rows = groups[-1] if groups else []
        width = widths[rows[0]] if rows else 0  # the first (longest) row sets the micro-batch's width
        over_budget = max_tokens is not None and (len(rows) + 1) * width > max_tokens
        if not rows or len(rows) == max_rows or over_budget:
            groups.append([i])
        else:
            rows.append(i)
    return [MicroBatchPlan(rows, [widths[i] for i in rows]) for rows in groups]
