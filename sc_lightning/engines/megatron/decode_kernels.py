"""Triton kernels of the Megatron engine's fused decode path (``CachedForward(..., fused_decode=True)``): fewer,
larger kernels per layer where a decode step is a few hundred tiny ones.

- :func:`add_rms_norm`: the residual add folded into the next RMSNorm (one kernel instead of two);
- :func:`rope_write_kv`: RoPE of the query heads and the key, the query laid out for attention and the K/V written
  into the cache at each token's slot and position (one kernel instead of six);
- :func:`decode_attention`: a decode step's attention, each row reading exactly its own cached positions, split
  into units of :data:`SPLIT_POSITIONS` so a long row does not hold the step up (two kernels).

Imported only where Triton exists (GPU builds of torch ship it). All compute in fp32 registers and round once on
the store; RoPE takes its angles in fp32, as :func:`sc_lightning.models.triton_kernels.rope` does in training.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, delta_ptr, weight_ptr, sum_ptr, out_ptr, width, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    x = tl.load(x_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:  # the residual stream is kept in the model dtype, as the unfused add keeps it
        x = x + tl.load(delta_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * width + cols, x, mask=mask)
        x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / width + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * width + cols, (x * rstd * weight).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(s, rms_norm(s) * weight)`` with ``s = x + delta`` (``s = x`` when ``delta`` is None), over the last dim."""
    x = x.contiguous()
    width = x.size(-1)
    total = torch.empty_like(x) if delta is not None else x
    out = torch.empty_like(x)
    rows = x.numel() // width
    if rows:
        _add_rms_norm_kernel[(rows,)](
            x,
            delta.contiguous() if delta is not None else x,
            weight,
            total,
            out,
            width,
            eps,
            HAS_DELTA=delta is not None,
            BLOCK=triton.next_power_of_2(width),
        )
    return total, out


@triton.jit
def _rope_write_kv_kernel(
    qkv_ptr,
    angles_ptr,
    positions_ptr,
    index_ptr,
    cache_ptr,
    query_ptr,
    width,
    groups,
    hpg,
    half,
    HEADS: tl.constexpr,
    HALF: tl.constexpr,
    KV_MAX: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)  # row * width + t
    group = tl.program_id(1).to(tl.int64)
    row, t = token // width, token % width
    head_dim = 2 * half
    dim = tl.arange(0, HALF)
    dim_mask = dim < half
    position = tl.load(positions_ptr + token)
    angle_first = tl.load(angles_ptr + position * head_dim + dim, mask=dim_mask)
    angle_second = tl.load(angles_ptr + position * head_dim + half + dim, mask=dim_mask)
    cos_first, sin_first = tl.cos(angle_first), tl.sin(angle_first)
    cos_second, sin_second = tl.cos(angle_second), tl.sin(angle_second)
    source = qkv_ptr + (token * groups + group) * (hpg + 2) * head_dim  # this group's query heads, K, V
    # the query heads: rotated, into the attention layout (rows, groups, width * hpg, head_dim)
    head = tl.arange(0, HEADS)[:, None]
    mask = (head < hpg) & dim_mask[None, :]
    first = tl.load(source + head * head_dim + dim[None, :], mask=mask).to(tl.float32)
    second = tl.load(source + head * head_dim + half + dim[None, :], mask=mask).to(tl.float32)
    target = query_ptr + (((row * groups + group) * width + t) * hpg + head) * head_dim + dim[None, :]
    dtype = query_ptr.dtype.element_ty
    tl.store(target, (first * cos_first[None, :] - second * sin_first[None, :]).to(dtype), mask=mask)
    tl.store(target + half, (second * cos_second[None, :] + first * sin_second[None, :]).to(dtype), mask=mask)
    # the key (rotated) and the value, into the cache row slot * length + position (an fp8 cache saturated)
    cache = cache_ptr + (tl.load(index_ptr + token) * groups + group) * 2 * head_dim
    kv_dtype = cache_ptr.dtype.element_ty
    key_first = tl.load(source + hpg * head_dim + dim, mask=dim_mask).to(tl.float32)
    key_second = tl.load(source + hpg * head_dim + half + dim, mask=dim_mask).to(tl.float32)
    key_first, key_second = (
        key_first * cos_first - key_second * sin_first,
        key_second * cos_second + key_first * sin_second,
    )
    tl.store(cache + dim, tl.clamp(key_first, -KV_MAX, KV_MAX).to(kv_dtype), mask=dim_mask)
    tl.store(cache + half + dim, tl.clamp(key_second, -KV_MAX, KV_MAX).to(kv_dtype), mask=dim_mask)
    value = source + (hpg + 1) * head_dim
    value_first = tl.load(value + dim, mask=dim_mask).to(tl.float32)
    value_second = tl.load(value + half + dim, mask=dim_mask).to(tl.float32)
    tl.store(cache + head_dim + dim, tl.clamp(value_first, -KV_MAX, KV_MAX).to(kv_dtype), mask=dim_mask)
    tl.store(cache + head_dim + half + dim, tl.clamp(value_second, -KV_MAX, KV_MAX).to(kv_dtype), mask=dim_mask)


def rope_write_kv(qkv: Tensor, angles: Tensor, positions: Tensor, flat_index: Tensor, cache: Tensor) -> Tensor:
    """RoPE and cache write of ``qkv`` ``(R, T, G, hpg + 2, D)`` (megatron's per-group layout) in one kernel.

    ``angles`` ``(L, D)`` fp32 are RoPE's angles by position, ``positions`` ``(R, T)`` each token's position,
    ``flat_index`` ``(R * T,)`` its cache row ``slot * length + position`` in ``cache`` ``(slots * length, G, 2, D)``
    (K then V), in the model's dtype or fp8 (values past fp8's range saturate). Returns the rotated query
    ``(R, G, T * hpg, D)``, query row ``t * hpg + j`` for head ``j`` of a group.
    """
    rows, width, groups, heads_and_kv, head_dim = qkv.shape
    hpg = heads_and_kv - 2
    qkv = qkv.contiguous()
    query = torch.empty((rows, groups, width * hpg, head_dim), dtype=qkv.dtype, device=qkv.device)
    if rows * width:
        _rope_write_kv_kernel[(rows * width, groups)](
            qkv,
            angles,
            positions.contiguous(),
            flat_index,
            cache,
            query,
            width,
            groups,
            hpg,
            head_dim // 2,
            HEADS=triton.next_power_of_2(hpg),
            HALF=triton.next_power_of_2(head_dim // 2),
            KV_MAX=torch.finfo(cache.dtype).max,
        )
    return query


SPLIT_POSITIONS = 512  # a decode step's attention work unit: this many of a row's cached positions


@triton.jit
def _decode_attention_split_kernel(
    query_ptr,
    cache_ptr,
    positions_ptr,
    table_ptr,
    part_ptr,
    stats_ptr,
    length,
    max_blocks,
    groups,
    hpg,
    splits,
    scale,
    HEADS: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLIT: tl.constexpr,
    FP16_PRODUCTS: tl.constexpr,
    PAGED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2).to(tl.int64)
    seen = tl.load(positions_ptr + row) + 1  # the row's positions 0..p, its own K/V written just before
    first = split * SPLIT
    if first < seen:  # a split past the row's end has nothing to read
        last = tl.minimum(first + SPLIT, seen)
        head = tl.arange(0, HEADS)[:, None]
        dim = tl.arange(0, DIM)[None, :]
        heads = (row * groups + group) * hpg + head  # this group's query heads, rows of query
        query = tl.load(query_ptr + heads * DIM + dim, mask=head < hpg, other=0.0)  # (HEADS, DIM)
        if FP16_PRODUCTS:  # an fp8 cache: fp8 -> fp16 is one instruction a pair on Hopper, fp8 -> bf16 is not
            query = query.to(tl.float16)
        best = tl.full((HEADS,), float("-inf"), tl.float32)
        total = tl.zeros((HEADS,), tl.float32)
        acc = tl.zeros((HEADS, DIM), tl.float32)
        for start in range(first, last, BLOCK):  # online softmax over this split, BLOCK positions at a time
            position = start + tl.arange(0, BLOCK)
            valid = position < last
            if PAGED:  # BLOCK positions are one block of the row's table
                block = tl.load(table_ptr + row * max_blocks + start // BLOCK).to(tl.int64)
                flat = block * BLOCK + tl.arange(0, BLOCK)
            else:
                flat = row * length + position
            kv = cache_ptr + (flat[:, None] * groups + group) * 2 * DIM + dim  # (BLOCK, DIM)
            key = tl.load(kv, mask=valid[:, None], other=0.0).to(query.dtype)  # an fp8 cache read in 16 bits
            scores = tl.dot(query, tl.trans(key)).to(tl.float32) * scale  # (HEADS, BLOCK)
            scores = tl.where(valid[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            rescale = tl.exp(best - new_best)
            weights = tl.exp(scores - new_best[:, None])
            total = total * rescale + tl.sum(weights, axis=1)
            value = tl.load(kv + DIM, mask=valid[:, None], other=0.0).to(query.dtype)
            acc = acc * rescale[:, None] + tl.dot(weights.to(value.dtype), value).to(tl.float32)
            best = new_best
        own = tl.arange(0, HEADS) < hpg
        unit = ((row * groups + group) * splits + split) * hpg + tl.arange(0, HEADS)  # this split's partials
        tl.store(part_ptr + unit[:, None] * DIM + dim, acc, mask=own[:, None])
        tl.store(stats_ptr + unit * 2, best, mask=own)
        tl.store(stats_ptr + unit * 2 + 1, total, mask=own)


@triton.jit
def _decode_attention_combine_kernel(
    part_ptr,
    stats_ptr,
    positions_ptr,
    out_ptr,
    groups,
    hpg,
    splits,
    HEADS: tl.constexpr,
    DIM: tl.constexpr,
    SPLIT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1).to(tl.int64)
    used = tl.cdiv(tl.load(positions_ptr + row) + 1, SPLIT)  # the splits that read something
    head = tl.arange(0, HEADS)
    own = head < hpg
    dim = tl.arange(0, DIM)[None, :]
    best = tl.full((HEADS,), float("-inf"), tl.float32)
    total = tl.zeros((HEADS,), tl.float32)
    acc = tl.zeros((HEADS, DIM), tl.float32)
    for split in range(0, used):  # the splits' softmaxes merged, each rescaled to the running maximum
        unit = ((row * groups + group) * splits + split) * hpg + head
        split_best = tl.load(stats_ptr + unit * 2, mask=own, other=0.0)
        new_best = tl.maximum(best, split_best)
        old_scale, split_scale = tl.exp(best - new_best), tl.exp(split_best - new_best)
        total = total * old_scale + tl.load(stats_ptr + unit * 2 + 1, mask=own, other=1.0) * split_scale
        part = tl.load(part_ptr + unit[:, None] * DIM + dim, mask=own[:, None], other=0.0)
        acc = acc * old_scale[:, None] + part * split_scale[:, None]
        best = new_best
    heads = (row * groups + group) * hpg + head[:, None]  # rows of out, heads in megatron's order
    tl.store(out_ptr + heads * DIM + dim, (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=own[:, None])


def decode_attention(
    query: Tensor,
    cache: Tensor,
    positions: Tensor,
    scale: float,
    split: int = SPLIT_POSITIONS,
    block: int = 64,
    tables: Tensor | None = None,
) -> Tensor:
    """Attention of one new token per row over its own cached positions ``0..p``, read exactly (no padded span).

    ``query`` ``(R, G, hpg, D)`` (row ``r`` in cache slot ``r``), ``cache`` the layer's ``(slots, length, G, 2, D)``,
    ``positions`` ``(R,)`` each row's position ``p``. Returns ``(R, 1, G * hpg * D)``, heads in megatron's order.
    A group's query heads share each K/V read (tensor cores for both products). The work is split by ``split``
    positions of a row (flash decoding): one program per row, group and split, then one per row and group merging
    the splits' softmaxes, so a long row's positions spread over many programs instead of one program per row
    reading a long tail's thousands of positions while the short rows' programs have long finished. The grid
    covers the cache's whole length, so it is the same for every step (CUDA graphs); splits past a row's end return
    at once. ``block`` is the positions one loop iteration reads. On an fp8 cache both products run in fp16 (the
    query converted: a bf16 query past fp16's 65,504 would overflow, far beyond what attention queries hold).

    A paged cache (:mod:`~sc_lightning.engines.megatron.paged_kv`): ``cache`` is the layer's ``(blocks, block, G, 2,
    D)`` and ``tables`` ``(R', max_blocks)`` int32 each row's blocks (``block`` positions each, the loop's step);
    ``split`` must be a multiple of ``block``.
    """
    rows, groups, hpg, dim = query.shape
    out = torch.empty((rows, 1, groups * hpg * dim), dtype=query.dtype, device=query.device)
    if tables is not None and (cache.size(1) != block or split % block):
        raise ValueError(
            f"a paged cache's blocks ({cache.size(1)}) must be the kernel's block ({block}) and divide "
            f"its split ({split})"
        )
    if rows:
        length = cache.size(1) if tables is None else tables.size(1) * block  # positions a row can hold
        heads = max(16, triton.next_power_of_2(hpg))  # tl.dot's smallest tile
        splits = triton.cdiv(length, split)
        part = torch.empty((rows, groups, splits, hpg, dim), dtype=torch.float32, device=query.device)
        stats = torch.empty((rows, groups, splits, hpg, 2), dtype=torch.float32, device=query.device)
        positions = positions.contiguous()
        _decode_attention_split_kernel[(rows, groups, splits)](
            query.contiguous(),
            cache,
            positions,
            tables if tables is not None else positions,  # unread unless paged
            part,
            stats,
            length,
            tables.size(1) if tables is not None else 0,
            groups,
            hpg,
            splits,
            scale,
            HEADS=heads,
            DIM=dim,
            BLOCK=min(block, split),
            SPLIT=split,
            FP16_PRODUCTS=cache.element_size() == 1,
            PAGED=tables is not None,
        )
        _decode_attention_combine_kernel[(rows, groups)](
            part, stats, positions, out, groups, hpg, splits, HEADS=heads, DIM=dim, SPLIT=split
        )
    return out
