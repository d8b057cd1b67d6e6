"""The Megatron engine's KV cache: one preallocated slot per running request, and the shape buckets it is read in.

:class:`SlotKVCache` holds K and V of every layer as one tensor ``(layers, slots, length, groups, 2, head_dim)`` in the
model's dtype or in fp8 (:data:`FP8`, ``kv_cache_dtype: fp8``: half the bytes to hold and to read a decode step, values
rounded to 3 mantissa bits and saturated at 448) on its device, allocated once (zeros, so a masked-out position never
holds a NaN that ``0 * NaN`` would spread). Each running request owns a slot; the model writes the K/V of the positions
it is fed in place (``index_copy_`` at ``slot * length + position``). Seen from a layer, the cache is a varlen K/V store
``(slots * length, groups, head_dim)`` for K and for V (:meth:`SlotKVCache.flat`: slot ``s`` is the sequence starting at
row ``s * length``, which flash attention reads up to each row's own length), or per slot ``(length, groups, head_dim)``
strided views for the generic attention path.

On a GPU the cache is sized from a memory budget when it is allocated (:func:`rows_within_budget`): a fraction of
the device memory free at that moment, so a colocated engine waking beside the trainer's weights and optimizer state
takes what is left, never more; the engine then runs fewer rows than ``max_batch_size`` and requests beyond them wait.

The buckets fix the shapes a CUDA graph is captured for: :func:`batch_bucket` (powers of two up to the engine's
``max_batch_size``) and, where attention reads a fixed span, :func:`kv_bucket` (multiples of 64 up to 512
positions, then steps of an eighth of the next power of two, so at most 25% of what is read is padding past 256).
"""

from __future__ import annotations

import torch
from torch import Tensor

KV_ALIGN = 64  # positions: a kv_bucket is a multiple of this, and so is the cache length
FP8 = torch.float8_e4m3fn  # an fp8 cache's dtype (``kv_cache_dtype: fp8``): half a 16-bit cache's bytes
FP8_MAX = torch.finfo(FP8).max  # what an fp8 cache saturates at (448)


def batch_bucket(rows: int, limit: int) -> int:
    """The smallest power of two ``>= rows``, capped at ``limit`` (the batch size a decode graph is captured for)."""
    return min(1 << max(0, rows - 1).bit_length(), limit)


def kv_bucket(positions: int, limit: int) -> int:
    """How many cache positions a step reads when it needs ``positions``: rounded up to a bucket, capped at ``limit``.

    Multiples of 64 up to 512, then of 128 up to 1024, of 256 up to 2048, and so on.
    """
    step = max(KV_ALIGN, 1 << max(0, (positions - 1).bit_length() - 3))
    return min(-(-positions // step) * step, limit)


def slot_bytes(*, layers: int, groups: int, length: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one slot of a :class:`SlotKVCache`: K and V of every layer for ``length`` positions (aligned)."""
    aligned = -(-length // KV_ALIGN) * KV_ALIGN
    return layers * aligned * groups * 2 * head_dim * dtype.itemsize


def free_device_bytes(device: torch.device) -> int | None:
    """Bytes this process can still allocate on ``device``: the CUDA driver's free memory plus what PyTorch's caching
    allocator holds unused (a colocated trainer's freed activations); None off CUDA, where no budget applies."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def rows_within_budget(*, free_bytes: int, fraction: float, row_bytes: int, max_rows: int) -> int:
    """How many cache rows fit in ``fraction`` of ``free_bytes``, at most ``max_rows``; ValueError when none does.

    The rest of the free memory (``1 - fraction``) is the engine's headroom for what a step allocates (a prefill
    chunk's activations and logits, the sampled tokens).
    """
    budget = int(free_bytes * fraction)
    rows = min(max_rows, budget // row_bytes)
    if rows < 1:
        raise ValueError(
            f"one KV-cache row needs {row_bytes / 2**20:,.0f} MiB, but {fraction:g} of the "
            f"{free_bytes / 2**20:,.0f} MiB free on the device is {budget / 2**20:,.0f} MiB: raise "
            "policy.generation.mcore_generation_config.kv_cache_memory_fraction, lower "
            "policy.max_total_sequence_length, or free device memory (a smaller policy.train_micro_batch_tokens)"
        )
    return rows


class SlotKVCache:
    """K and V of every layer for ``slots`` sequences of up to ``length`` positions, preallocated (zeros)."""

    def __init__(
        self,
        *,
        layers: int,
        slots: int,
        groups: int,
        length: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        length = -(-length // KV_ALIGN) * KV_ALIGN
        self.tensor = torch.zeros((layers, slots, length, groups, 2, head_dim), dtype=dtype, device=device)

    @property
    def length(self) -> int:
        """Positions per slot (a multiple of 64, at least the engine's ``max_seq_len``)."""
        return self.tensor.size(2)

    @property
    def slots(self) -> int:
        """How many sequences the cache holds at once."""
        return self.tensor.size(1)

    def layer(self, index: int) -> Tensor:
        """The cache of layer ``index``: ``(slots, length, groups, 2, head_dim)``, K at ``[..., 0, :]``, V at 1."""
        return self.tensor[index]

    def flat(self, index: int) -> Tensor:
        """Layer ``index`` as rows ``slot * length + position``: ``(slots * length, groups, 2, head_dim)``."""
        layer = self.tensor[index]
        return layer.view(-1, *layer.shape[2:])

    contiguous_rows = True  # a row's positions are one run of flat rows (what flash attention's varlen reads)

    def flat_index(self, rows: Tensor, positions: Tensor) -> Tensor:
        """Where positions ``positions`` ``(R, T)`` of slots ``rows`` ``(R,)`` live in :meth:`flat`: ``(R * T,)``."""
        return (rows[:, None] * self.length + positions).flatten()

    def read(self, index: int, slots: Tensor | None, count: int, kv_len: int) -> Tensor:
        """The first ``kv_len`` positions of layer ``index`` of slots ``slots`` (None: the first ``count``, a view):
        ``(R, kv_len, groups, 2, head_dim)``."""
        layer = self.tensor[index]
        return layer[:count, :kv_len] if slots is None else layer[slots, :kv_len]

    def decode_inputs(self, index: int) -> tuple[Tensor, Tensor | None]:
        """What the decode attention kernel reads for layer ``index``: the layer, and no block tables."""
        return self.tensor[index], None

    def move(self, source: int, target: int, positions: int) -> None:
        """Copy the first ``positions`` positions of slot ``source`` into slot ``target`` (every layer, K and V)."""
        if positions > 0 and source != target:
            self.tensor[:, target, :positions].copy_(self.tensor[:, source, :positions])
