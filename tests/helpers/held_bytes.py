"""How many bytes of gathered weights are alive at once: a counter for the bounded refit buckets."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

Unit = list[tuple[str, torch.Tensor]]  # a unit's named tensors, as a gather returns them


class HeldBytes:
    """The bytes of the tensors handed out by watched gathers that are still alive, and their peak."""

    def __init__(self) -> None:
        self.alive = 0
        self.peak = 0

    def watch(self, gather: Callable[[], Unit]) -> Callable[[], Unit]:
        """``gather`` (a unit's thunk), counting each tensor it returns until it is freed."""

        def watched() -> Unit:
            unit = gather()
            for _, tensor in unit:
                size = tensor.numel() * tensor.element_size()
                self.alive += size
                weakref.finalize(tensor, self._freed, size)
            self.peak = max(self.peak, self.alive)
            return unit

        return watched

    def _freed(self, size: int) -> None:
        self.alive -= size
