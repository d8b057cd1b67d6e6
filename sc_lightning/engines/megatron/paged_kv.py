"""A paged KV cache for the Megatron engine: K/V in blocks of :data:`PAGE` positions, each row's in the blocks its
block table lists.

The slot cache (:mod:`~sc_lightning.engines.megatron.kv_cache`) gives every row the whole context, so a batch of
long-tailed answers holds few rows: most of each slot stays empty while its row is short. Here a row holds only the
blocks its positions need, taken from a shared pool as it grows, so the same memory holds several times the rows
(and a step's decode reads the weights once for all of them).

:class:`PagedKVCache` holds K and V of every layer as ``(layers, blocks, PAGE, groups, 2, head_dim)`` and, per row, a
block table: the host's lists (the engine's bookkeeping) mirrored into a device tensor ``(rows, max_blocks)`` int32
that kernels read (a CUDA graph's static input). Position ``p`` of row ``r`` lives at flat row
``table[r, p // PAGE] * PAGE + p % PAGE`` of a layer (:meth:`PagedKVCache.flat_index`).

- **Block 0 is scratch**, never handed out: a table entry a row has not filled reads 0, so a padding row of a graph
  batch, or a placeholder row writing scratch K/V, writes there and nowhere that matters.
- **Sharing.** A prompt group's rows share the prompt's full blocks (:meth:`PagedKVCache.share`; the prompt's last,
  partial block is copied): the blocks are counted per holder and return to the pool with their last one. A shared
  block is never written again: the rows that share it only write positions past it.
- **Growing** (:meth:`PagedKVCache.reserve`) takes blocks for a row's next positions, all or none: when the pool
  runs dry the engine frees a row (preemption) and reserves again.
- **Moving** a row to another row's place (the batch keeps rows in ``0..n-1``) moves its table, not its K/V.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sc_lightning.engines.megatron.kv_cache import SlotKVCache

PAGE = 64  # positions per block: the decode attention kernel's loop block
SCRATCH = 0  # the block unused table entries point at


def blocks_for(positions: int) -> int:
    """How many blocks hold ``positions`` positions."""
    return -(-positions // PAGE)


class PagedKVCache:
    """K and V of every layer in ``blocks`` blocks of :data:`PAGE` positions, and the block tables of ``max_rows``
    rows of up to ``max_positions`` positions each (block 0 is scratch: ``blocks - 1`` can be held)."""

    def __init__(
        self,
        *,
        layers: int,
        blocks: int,
        groups: int,
        head_dim: int,
        max_rows: int,
        max_positions: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if blocks < 2:
            raise ValueError(f"a paged KV cache needs the scratch block and one more, got {blocks} blocks")
        self.tensor = torch.zeros((layers, blocks, PAGE, groups, 2, head_dim), dtype=dtype, device=device)
        self.max_blocks = blocks_for(max_positions)
        with torch.inference_mode(False):  # a normal tensor: the engine also rewrites tables outside inference mode
            self.tables = torch.full((max_rows, self.max_blocks), SCRATCH, dtype=torch.int32, device=device)
        self._held: list[list[int]] = [[] for _ in range(max_rows)]  # each row's blocks, in position order
        self._holders = [0] * blocks  # how many rows hold each block
        self._free = list(range(blocks - 1, SCRATCH, -1))  # a stack: the lowest block is handed out first

    @property
    def slots(self) -> int:
        """How many rows the cache holds at once (its tables' rows)."""
        return self.tables.size(0)

    @property
    def length(self) -> int:
        """Positions a row can hold (a multiple of :data:`PAGE`)."""
        return self.max_blocks * PAGE

    @property
    def free_blocks(self) -> int:
        """Blocks the pool can still hand out."""
        return len(self._free)

    def blocks_of(self, row: int) -> list[int]:
        """The blocks row ``row`` holds, in position order."""
        return list(self._held[row])

    def reserve(self, row: int, positions: int) -> bool:
        """Make row ``row`` hold blocks for its first ``positions`` positions; False (taking nothing) when the pool
        has too few free blocks."""
        held = self._held[row]
        need = blocks_for(positions) - len(held)
        if need <= 0:
            return True
        if need > len(self._free) or len(held) + need > self.max_blocks:
            return False
        taken = [self._free.pop() for _ in range(need)]
        for block in taken:
            self._holders[block] = 1
        self._write_table(row, len(held), taken)
        held.extend(taken)
        return True

    def share(self, source: int, target: int, positions: int) -> int:
        """Make empty row ``target`` hold row ``source``'s first ``positions`` positions (a prompt both rows have):
        the blocks wholly within them shared, the rest copied into a block of its own (the source goes on writing
        its partial block). Returns the positions ``target`` now holds: all of them, or the shared ones when the
        pool has no block for the copy."""
        if self._held[target]:
            raise ValueError(f"row {target} already holds blocks: only an empty row takes shared ones")
        full, rest = divmod(positions, PAGE)
        shared = self._held[source][:full]
        for block in shared:
            self._holders[block] += 1
        self._write_table(target, 0, shared)
        self._held[target] = list(shared)
        if rest and self.reserve(target, positions):
            partial, own = self._held[source][full], self._held[target][full]
            self.tensor[:, own, :rest].copy_(self.tensor[:, partial, :rest])
            return positions
        return full * PAGE

    def release(self, row: int) -> None:
        """Let go of row ``row``'s blocks (each returns to the pool with its last holder); its table points at
        scratch again."""
        for block in self._held[row]:
            self._holders[block] -= 1
            if self._holders[block] == 0:
                self._free.append(block)
        if self._held[row]:
            self.tables[row].fill_(SCRATCH)
        self._held[row] = []

    def move(self, source: int, target: int) -> None:
        """Give row ``source``'s blocks to empty row ``target`` (its K/V stay where they are)."""
        if source == target:
            return
        if self._held[target]:
            raise ValueError(f"row {target} already holds blocks: release it before moving row {source} there")
        self._held[target], self._held[source] = self._held[source], []
        self.tables[target].copy_(self.tables[source])
        self.tables[source].fill_(SCRATCH)

    def flat_index(self, rows: Tensor, positions: Tensor) -> Tensor:
        """Where positions ``positions`` ``(R, T)`` of rows ``rows`` ``(R,)`` live in a layer's flat
        ``(blocks * PAGE, groups, 2, head_dim)`` view: ``(R * T,)`` (unreserved positions: the scratch block)."""
        blocks = self.tables[rows[:, None], positions // PAGE].long()
        return (blocks * PAGE + positions % PAGE).flatten()

    contiguous_rows = False  # a row's positions are scattered over blocks

    def read(self, index: int, rows: Tensor | None, count: int, kv_len: int) -> Tensor:
        """The first ``kv_len`` positions of layer ``index`` of rows ``rows`` (None: the first ``count``), gathered
        through their tables: ``(R, kv_len, groups, 2, head_dim)`` (unreserved positions read the scratch block)."""
        tables = self.tables[:count] if rows is None else self.tables[rows]
        blocks = self.tensor[index][tables[:, : blocks_for(kv_len)].long()]  # (R, n, PAGE, groups, 2, head_dim)
        return blocks.flatten(1, 2)[:, :kv_len]

    def decode_inputs(self, index: int) -> tuple[Tensor, Tensor | None]:
        """What the decode attention kernel reads for layer ``index``: its blocks and the rows' block tables."""
        return self.tensor[index], self.tables

    def flat(self, layer: int) -> Tensor:
        """Layer ``layer`` as flat rows ``block * PAGE + offset``: ``(blocks * PAGE, groups, 2, head_dim)``."""
        return self.tensor[layer].flatten(0, 1)

    def _write_table(self, row: int, start: int, blocks: list[int]) -> None:
        """Set entries ``start..`` of row ``row``'s device table to ``blocks``."""
        if blocks:
            values = torch.tensor(blocks, dtype=torch.int32)
            if self.tables.is_cuda:  # pinned: the copy queues behind a decode step in flight instead of waiting for it
                values = values.pin_memory()
            self.tables[row, start : start + len(blocks)].copy_(values, non_blocking=True)


KVCache = SlotKVCache | PagedKVCache
"""Either KV cache: both give a forward :meth:`~PagedKVCache.flat`, ``flat_index``, ``read`` and ``decode_inputs``."""
