"""Micro-batches with little padding: rows sorted by length, cut by a row count and a token budget.

A chunk's rows are right-padded to its longest row. Attention is causal, so a row's loss terms only see positions up
to its last valid (loss-counted) token: each row *needs* ``last valid position + 1`` columns, and a row with no valid
token needs none (it adds nothing to the loss or to any metric, so it is not run at all). :func:`plan_microbatches`
sorts the rows that need columns by that length, longest first, and cuts the sorted list into micro-batches of at
most ``max_rows`` rows whose padded size (rows x the longest row in it) stays within ``max_tokens``; each micro-batch
is then trimmed to its own longest row. A row longer than the budget gets a micro-batch of its own. The gradient is a
sum over rows, so the order and grouping change nothing but floating-point summation order.

With ``width_multiple`` > 1 a micro-batch's width is its longest row rounded up to a multiple of it (at most the
chunk's own width), and the budget counts that width: the extra columns lie past every row's last valid token, so
causal attention keeps them out of every loss term, and a run's micro-batches take a few recurring shapes instead of
a new one each. Kernels that plan per shape (cuDNN's attention builds an execution plan for each new shape, ~35 ms
forward and backward at the 1.26B benchmark shape on an H100) then plan once per shape instead of once per
micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MicroBatchPlan:
    """One micro-batch: which rows of the chunk (``rows``), each one's needed length, the columns run (``width``:
    the longest row's length, or that rounded up; see the module docstring)."""

    rows: list[int]
    lengths: list[int]
    width: int

    @property
    def padded_tokens(self) -> int:
        """The tokens the forward pass runs: rows x width."""
        return len(self.rows) * self.width


def needed_widths(mask: torch.Tensor) -> list[int]:
    """Per row of a (B, T) loss mask: its last valid position + 1, or 0 without any valid token (one host read)."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.bool() * positions).amax(dim=1).tolist()


def plan_microbatches(
    widths: list[int],
    *,
    max_rows: int,
    max_tokens: int | None = None,
    width_multiple: int = 1,
    max_width: int | None = None,
) -> list[MicroBatchPlan]:
    """Group the rows with ``widths[i] > 0`` into micro-batches (longest rows first; see the module docstring); each
    micro-batch's width is its longest row's rounded up to ``width_multiple``, at most ``max_width`` (the chunk's)."""
    if max_rows < 1 or width_multiple < 1:
        raise ValueError(f"max_rows and width_multiple must be >= 1, got {max_rows} and {width_multiple}")

    def rounded(width: int) -> int:
        """``width`` up to a multiple of ``width_multiple``, within ``max_width``."""
        up = -(-width // width_multiple) * width_multiple
        return up if max_width is None else max(width, min(up, max_width))

    order = sorted((i for i, width in enumerate(widths) if width > 0), key=lambda i: -widths[i])
    groups: list[list[int]] = []
    for i in order:
        rows = groups[-1] if groups else []
        width = rounded(widths[rows[0]]) if rows else 0  # the first (longest) row sets the micro-batch's width
        over_budget = max_tokens is not None and (len(rows) + 1) * width > max_tokens
        if not rows or len(rows) == max_rows or over_budget:
            groups.append([i])
        else:
            rows.append(i)
    return [MicroBatchPlan(rows, [widths[i] for i in rows], rounded(widths[rows[0]])) for rows in groups]
