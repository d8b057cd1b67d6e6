"""Where a continuous batch's rows keep their K/V: a slot cache or a paged one, allocated, grown, moved and shared.

:class:`KVRows` is the batch's one view of its cache, whichever layout it is:

- **slots** (:class:`~sc_lightning.engines.megatron.kv_cache.SlotKVCache`): each row owns a slot of the whole
  context from the allocation on; growing never fails; a row moving to a freed slot copies its K/V; a prompt is taken
  from another row by copying its positions.
- **paged** (:class:`~sc_lightning.engines.megatron.paged_kv.PagedKVCache`): a row holds the blocks its positions
  need, taken as it grows (:meth:`KVRows.reserve` may fail: the pool is dry, and the batch preempts a row); a move
  hands over the row's block table; a prompt is taken by sharing the other row's full blocks (its partial one copied).

On a GPU both are sized from the memory budget when allocated (``memory_fraction`` of the memory free then): slots
of the whole context, or blocks of :data:`~sc_lightning.engines.megatron.paged_kv.PAGE` positions.
"""

from __future__ import annotations

from typing import Literal

from sc_lightning.engines.megatron import kv_cache
from sc_lightning.engines.megatron.cached_forward import CachedForward
from sc_lightning.engines.megatron.kv_cache import rows_within_budget
from sc_lightning.engines.megatron.paged_kv import PAGE, KVCache, PagedKVCache, blocks_for

KVLayout = Literal["slots", "paged"]


class KVRows:
    """The K/V of up to ``max_rows`` rows of up to ``max_seq_len`` positions, in the ``layout`` given."""

    def __init__(
        self,
        forward: CachedForward,
        *,
        layout: KVLayout,
        max_rows: int,
        max_seq_len: int,
        memory_fraction: float | None,
        blocks: int | None = None,
    ) -> None:
        self.forward, self.layout = forward, layout
        self.max_rows, self.max_seq_len, self.memory_fraction = max_rows, max_seq_len, memory_fraction
        self.blocks = blocks  # a paged cache's pool (None: from the budget, or every row's whole context)
        self.cache: KVCache | None = None

    def allocate(self) -> int:
        """Allocate the cache; returns how many rows it holds at once."""
        free = kv_cache.free_device_bytes(self.forward.device)
        budget = None if free is None or self.memory_fraction is None else free
        if self.layout == "slots":
            slots = self.max_rows
            if budget is not None:
                row_bytes = self.forward.slot_bytes(self.max_seq_len)
                slots = rows_within_budget(
                    free_bytes=budget, fraction=self.memory_fraction, row_bytes=row_bytes, max_rows=self.max_rows
                )
            self.cache = self.forward.new_cache(slots, self.max_seq_len)
            return slots
        blocks = self.blocks or 1 + self.max_rows * blocks_for(self.max_seq_len)
        if self.blocks is None and budget is not None:
            block_bytes = self.forward.slot_bytes(PAGE)
            blocks = 1 + rows_within_budget(
                free_bytes=budget, fraction=self.memory_fraction, row_bytes=block_bytes, max_rows=blocks - 1
            )
        self.cache = self.forward.new_paged_cache(blocks, self.max_rows, self.max_seq_len)
        return self.max_rows

    def reserve(self, row: int, positions: int) -> bool:
        """Make row ``row`` able to hold ``positions`` positions; False when a paged pool has too few blocks."""
        assert self.cache is not None
        return not isinstance(self.cache, PagedKVCache) or self.cache.reserve(row, positions)

    def take_prompt(self, source: int, target: int, positions: int) -> int:
        """Give fresh row ``target`` row ``source``'s first ``positions`` positions; returns how many it now holds
        (paged: all of them, or only the full blocks' when no block is free for the partial one's copy)."""
        assert self.cache is not None
        if isinstance(self.cache, PagedKVCache):
            self.cache.release(target)  # blocks it took for scratch positions before its prompt came
            return self.cache.share(source, target, positions)
        self.cache.move(source, target, positions)
        return positions

    def remove(self, index: int, last: int, last_positions: int) -> None:
        """Row ``index`` leaves; the ``last`` row (holding ``last_positions`` positions) takes its place."""
        if self.cache is None:
            return
        if isinstance(self.cache, PagedKVCache):
            self.cache.release(index)
            self.cache.move(last, index)
        elif index != last:
            self.cache.move(last, index, last_positions)

    def forget(self, rows: int) -> None:
        """Rows ``0..rows-1`` recompute their K/V (new weights): a paged cache lets go of their blocks, so prompts
        are shared again as the rows refill."""
        if isinstance(self.cache, PagedKVCache):
            for row in range(rows):
                self.cache.release(row)
