"""One RL step's counts and metrics, folded over micro-batches on the device and reduced over data-parallel ranks.

Every named value combines by its reduction ("sum", "min" or "max"): over the micro-batches of a rank as they run,
then over the data-parallel ranks once, when the step is read. The reduction across ranks is torchmetrics'
(:class:`torchmetrics.Metric` with the data-parallel process group), so every rank reads the step's global values
and any logger on any rank logs them. All values live in one (4, N) state — row 0 sums, row 1 minima, row 2
maxima, row 3 "seen" flags — so a read is one gather and one device-to-host copy, whatever N is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torchmetrics import Metric

from sc_lightning.trainer.data_parallel import data_parallel_group

_ROW = {"sum": 0, "min": 1, "max": 2}
_SEEN = 3


def _reduce_gathered(gathered: torch.Tensor) -> torch.Tensor:
    """torchmetrics' reduction of the ranks' stacked (R, 4, N) states: sums add, minima and maxima and flags fold."""
    return torch.stack(
        [gathered[:, 0].sum(0), gathered[:, 1].amin(0), gathered[:, 2].amax(0), gathered[:, _SEEN].amax(0)]
    )


class StepTotals(Metric):
    """A step's named values, each combined by its reduction over micro-batches and data-parallel ranks."""

    full_state_update = False

    def __init__(self, reductions: Mapping[str, str], *, process_group: Any = None, sync: bool = True) -> None:
        """``reductions``: every name that may be added, with "sum", "min" or "max". ``process_group``: the ranks
        whose values combine (None: the default group); ``sync=False`` reads this rank's values alone."""
        super().__init__(process_group=process_group, sync_on_compute=sync, compute_with_cache=False)
        self.rows = {name: _ROW[how] for name, how in reductions.items()}
        self.columns = {name: i for i, name in enumerate(reductions)}
        identity = torch.zeros(4, len(reductions), dtype=torch.float64)
        identity[1], identity[2] = torch.inf, -torch.inf
        self.add_state("values", default=identity, dist_reduce_fx=_reduce_gathered)
        self.update({})  # a rank that trains no rows still reads the step (torchmetrics warns on a read before one)

    def update(self, values: Mapping[str, torch.Tensor | float]) -> None:
        """Fold ``values`` in, each by its reduction; nothing leaves the device."""
        for name, value in values.items():
            row, column = self.rows[name], self.columns[name]
            value = torch.as_tensor(value, dtype=torch.float64, device=self.values.device).detach()
            slot = self.values[row, column]
            if row == 0:
                slot.add_(value)
            elif row == 1:
                torch.minimum(slot, value, out=slot)
            else:
                torch.maximum(slot, value, out=slot)
            self.values[_SEEN, column] = 1.0

    def fold_over(self, group: object) -> None:
        """Combine this rank's values with those of ``group``'s ranks in place (e.g. pipeline stages, of which only
        the last computes the loss), before the read reduces them over the data-parallel ranks."""
        ops = torch.distributed.ReduceOp
        for rows, op in ((slice(0, 1), ops.SUM), (slice(1, 2), ops.MIN), (slice(2, 4), ops.MAX)):
            torch.distributed.all_reduce(self.values[rows], op=op, group=group)

    def compute(self) -> dict[str, float]:
        """Every value some rank added, as a Python float (one device-to-host copy)."""
        table = self.values.tolist()
        return {name: table[self.rows[name]][i] for name, i in self.columns.items() if table[_SEEN][i]}


ROW_REDUCTIONS = {"rows": "sum", "tokens": "sum", "reward": "sum", "model_turns": "sum", "staleness": "sum"} | {
    "staleness_max": "max"
}
"""How a step's per-row values combine over the data-parallel ranks (:func:`row_totals`)."""


def row_totals(
    rewards: torch.Tensor, model_turns: torch.Tensor, staleness: list[int], tokens: int, device: torch.device
) -> dict[str, float]:
    """A step's ``rows``, trained ``tokens`` and per-row means (``reward``, ``model_turns_mean``,
    ``staleness_mean``) and ``staleness_max`` over every data-parallel rank, from this rank's rows (one reduction)."""
    group = data_parallel_group()
    totals = StepTotals(ROW_REDUCTIONS, process_group=group, sync=group is not None).to(device)
    totals.update(
        {
            "rows": len(staleness),
            "tokens": tokens,
            "reward": rewards.sum(),
            "model_turns": model_turns.sum(),
            "staleness": sum(staleness),
        }
    )
    if staleness:
        totals.update({"staleness_max": max(staleness)})
    read = totals.compute()
    rows = read["rows"]
    return {
        "rows": rows,
        "tokens": read["tokens"],
        "reward": read["reward"] / rows,
        "model_turns_mean": read["model_turns"] / rows,
        "staleness_mean": read["staleness"] / rows,
        "staleness_max": read["staleness_max"],
    }
