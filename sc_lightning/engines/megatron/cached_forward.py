"""A megatron ``GPTModel``'s forward over a slot KV cache, rows at any position (a VLM's: its language model's, fed
the merged image embeddings when a prefill chunk covers an image).

:class:`CachedForward` runs the model's own modules, with its weights (nothing is copied, so a weight update or a
CUDA graph sees the same tensors): the word embedding, then per layer ``input_layernorm`` → ``linear_qkv`` →
(``q_layernorm`` / ``k_layernorm``, a QK-norm model's per-head norms) → RoPE → write K/V into the cache → attention
over the cache → ``linear_proj`` + residual → ``pre_mlp_layernorm`` → ``mlp`` + residual, then ``final_layernorm``
and ``output_layer``. It is the computation of ``GPTModel.forward`` (local layer
spec, TP=1, no dropout) for ``T`` new tokens per row:

- **Positions are device tensors** ``(R, T)``, one per token, so rows of one call sit at different positions and
  nothing about them is baked into a captured CUDA graph. RoPE uses megatron's own frequency table
  (``model.rotary_pos_emb``) and formula ``t * cos + rotate_half(t) * sin`` (cos/sin cast to the model dtype first),
  gathered at each row's positions, applied in place to the query heads and the key of every KV group at once
  (three kernels: swap the halves, scale by cos, add the swapped halves times the signed sin).
- **Attention** of a token at position ``p`` covers positions ``0..p`` of its row's slot: an additive mask is built
  once per call from the positions over ``kv_len`` positions, and a KV group's query heads form the query rows of
  one attention "head" over the group's strided cache view, so grouped-query attention copies no K/V. On a GPU
  the memory-efficient kernel is called directly (it does not re-plan per KV length, and choosing kernels
  through ``sdpa_kernel`` would flip process-global flags under a colocated trainer); on the CPU,
  ``scaled_dot_product_attention``. With ``flash_decode`` a decode step (one token per row, rows in slots
  ``0..R-1``, bf16/fp16 on a GPU) calls flash attention's varlen kernel instead, each row reading exactly its own
  ``p + 1`` positions (``seqused_k``): no mask and no fixed KV span, but on an H200 at batch 16 and 64 it measured
  slower than the memory-efficient kernel (``benchmarks/README.md``), so it is off by default.
- **Rows** are either the cache's first ``R`` slots (a decode step: the cache is read in place) or the slots given
  (a prefill chunk: their K/V are gathered).
- **Fused** (``fused_decode``; by default wherever it can run: a GPU with Triton, RMSNorm layers, not with
  ``flash_decode``; on an H200 it decodes the 1.26B shape 1.4x faster at batch 64): each residual add is
  folded into the RMSNorm that follows it, and RoPE, the query's attention layout and the K/V cache write are one
  kernel (:mod:`~sc_lightning.engines.megatron.decode_kernels`; RoPE from fp32 angles, as the trainer's fused
  RoPE). In a bf16/fp16 model a decode step's attention is its own kernel too: each row reads exactly its ``p + 1``
  cached positions (no padded span, no mask), a KV group's query heads sharing each read, a row's positions split
  into units of 512 read by programs of their own and merged after (flash decoding).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from torch import Tensor

from sc_lightning.engines.megatron.kv_cache import FP8, FP8_MAX, SlotKVCache, slot_bytes
from sc_lightning.engines.megatron.paged_kv import KVCache, PagedKVCache
from sc_lightning.models.fused import triton_module


@dataclass
class _Call:
    """What every layer of one forward call shares: shapes, RoPE factors, cache indices, the attention inputs."""

    rows: int
    width: int  # tokens per row
    positions: Tensor  # (R, T)
    rope_tables: tuple[Tensor, Tensor]  # (L, D) cos and sin of every position, rotate_half's signs in the sin
    flat_index: Tensor  # (R * T,): slot * length + position, where each new K/V goes
    slots: Tensor | None  # the rows' slots (a gather), or None for slots 0..R-1 (read in place)
    kv_len: int
    flash: bool  # a decode step on flash attention
    _bias: Tensor | None = None

    @functools.cached_property
    def rope(self) -> tuple[Tensor, Tensor]:
        """``(R, T, 1, 1, D)`` cos and signed sin at the call's positions (gathered on first use: the fused path
        computes its own)."""
        return tuple(table[self.positions][:, :, None, None] for table in self.rope_tables)

    def bias(self, dtype: torch.dtype, heads_per_group: int) -> Tensor:
        """``(R, 1, T * heads_per_group, kv_len)``: 0 where a query may attend, -inf elsewhere (built once)."""
        if self._bias is None:
            keys = torch.arange(self.kv_len, device=self.positions.device)
            bias = torch.zeros((self.rows, self.width, self.kv_len), dtype=dtype, device=keys.device)
            bias.masked_fill_(keys > self.positions[:, :, None], float("-inf"))  # a token sees positions <= its own
            shape = (self.rows, 1, self.width, heads_per_group, self.kv_len)
            self._bias = bias[:, None, :, None].expand(shape).reshape(self.rows, 1, -1, self.kv_len)
        return self._bias


def _check_supported(model: torch.nn.Module) -> None:
    """Raise ValueError when ``model`` uses a feature :class:`CachedForward` does not reproduce."""
    config = model.config
    unsupported = {
        "position_embedding_type": getattr(model, "position_embedding_type", "rope") != "rope",
        "rotary_interleaved": config.rotary_interleaved,
        "multi_latent_attention": config.multi_latent_attention,
        "attention_output_gate": getattr(config, "attention_output_gate", False),
        "fp32_residual_connection": config.fp32_residual_connection,
        "num_moe_experts": bool(getattr(config, "num_moe_experts", None)),
        "tensor_model_parallel_size": config.tensor_model_parallel_size != 1,
        "pipeline parallelism": parallel_state.get_pipeline_model_parallel_world_size() != 1,
    }
    bad = [name for name, flag in unsupported.items() if flag]
    if bad:
        raise ValueError(f"the Megatron engine's cached forward does not support {', '.join(bad)}")


def _fused_kernels(model: torch.nn.Module, on_gpu: bool, fused: bool | None, flash: bool) -> ModuleType | None:
    """:mod:`~sc_lightning.engines.megatron.decode_kernels` where the fused decode path runs, else None.

    ``fused`` True asks for it (a ValueError where the model cannot take it), False turns it off, None (the default)
    takes it wherever it can run: a GPU, Triton, torch RMSNorm layers (megatron's local spec), no ``flash_decode``.
    """
    if fused is False or not on_gpu:
        return None
    norms = [model.decoder.final_layernorm]
    norms += [norm for layer in model.decoder.layers for norm in (layer.input_layernorm, layer.pre_mlp_layernorm)]
    problem = None
    if flash:
        problem = "does not combine with flash_decode"
    elif not all(isinstance(norm, torch.nn.RMSNorm) for norm in norms):
        problem = "needs torch RMSNorm layers (megatron's local spec)"
    if problem is not None:
        if fused:
            raise ValueError(f"the Megatron engine's fused decode path {problem}")
        return None
    return triton_module("sc_lightning.engines.megatron.decode_kernels")  # None on a torch without Triton


def write_kv(flat: Tensor, index: Tensor, kv: Tensor) -> None:
    """Write ``kv`` ``(N, G, 2, D)`` into rows ``index`` of a layer's ``flat`` cache; into an fp8 cache saturated at
    fp8's largest value (as bytes: torch's CPU ``index_copy_`` has no fp8)."""
    if flat.dtype != FP8:
        flat.index_copy_(0, index, kv)
        return
    fp8 = kv.clamp(-FP8_MAX, FP8_MAX).to(FP8)
    flat.view(torch.uint8).index_copy_(0, index, fp8.view(torch.uint8))


def _eps(norm: torch.nn.RMSNorm, dtype: torch.dtype) -> float:
    """The epsilon ``norm`` adds to the mean square (torch's default: the dtype's machine epsilon)."""
    return norm.eps if norm.eps is not None else torch.finfo(dtype).eps


class CachedForward:
    """Runs a TP=1 megatron ``GPTModel`` on new tokens of many rows, keeping their K/V in a slot KV cache."""

    def __init__(
        self,
        model: torch.nn.Module,
        max_seq_len: int,
        *,
        flash_decode: bool = False,
        fused_decode: bool | None = None,
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        _check_supported(model)
        self.embedding = model.embedding.word_embeddings
        self.layers = list(model.decoder.layers)
        self.final_layernorm = model.decoder.final_layernorm
        self.output_layer = model.output_layer
        tied = model.share_embeddings_and_output_weights
        self.output_weight = model.shared_embedding_or_output_weight() if tied else None
        attention = self.layers[0].self_attention
        self.groups = attention.num_query_groups_per_partition
        self.heads_per_group = attention.num_attention_heads_per_partition // self.groups
        self.head_dim = attention.hidden_size_per_attention_head
        self.qk_norm = model.config.qk_layernorm
        core = attention.core_attention
        self.scale = float(getattr(core, "softmax_scale", None) or self.head_dim**-0.5)
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        on_gpu = self.device.type == "cuda"
        self.cache_dtype = kv_cache_dtype or self.dtype
        if self.cache_dtype not in (self.dtype, FP8):
            raise ValueError(f"the Megatron engine's KV cache holds the model's dtype or fp8, not {self.cache_dtype}")
        sixteen_bit = self.dtype in (torch.bfloat16, torch.float16)
        self.flash = flash_decode and on_gpu and sixteen_bit and self.cache_dtype == self.dtype  # False once refused
        self.efficient = on_gpu  # likewise
        with torch.cuda.device(self.device) if on_gpu else contextlib.nullcontext():  # where megatron puts RoPE
            freqs = model.rotary_pos_emb(max_seq_len)  # (L, 1, 1, D) fp32, the trainer's table
        if freqs.size(-1) != self.head_dim:
            raise ValueError("the Megatron engine's cached forward needs RoPE over the whole head (rotary_percent 1)")
        freqs = freqs.reshape(max_seq_len, self.head_dim).to(self.device)
        self.kernels = _fused_kernels(model, on_gpu, fused_decode, flash_decode)
        self.angles = freqs.float().contiguous() if self.kernels is not None else None
        # decode steps on its attention kernel: tensor cores want 16-bit inputs and a power-of-two head of >= 16
        power_of_two = self.head_dim >= 16 and self.head_dim & (self.head_dim - 1) == 0
        self.kernel_decode_attention = self.kernels is not None and sixteen_bit and power_of_two
        half = self.head_dim // 2
        self.cos = torch.cos(freqs).to(self.dtype)  # (L, D), as megatron: cos in fp32, then the model dtype
        sin = torch.sin(freqs).to(self.dtype)
        self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # rotate_half's sign folded in

    def slot_bytes(self, length: int) -> int:
        """Bytes one slot of :meth:`new_cache` takes for sequences of up to ``length`` positions."""
        return slot_bytes(
            layers=len(self.layers), groups=self.groups, length=length, head_dim=self.head_dim, dtype=self.cache_dtype
        )

    def new_cache(self, slots: int, length: int) -> SlotKVCache:
        """A zeroed KV cache for ``slots`` sequences of up to ``length`` positions, for this model."""
        return SlotKVCache(
            layers=len(self.layers),
            slots=slots,
            groups=self.groups,
            length=length,
            head_dim=self.head_dim,
            dtype=self.cache_dtype,
            device=self.device,
        )

    def new_paged_cache(self, blocks: int, max_rows: int, max_positions: int) -> PagedKVCache:
        """A zeroed paged KV cache of ``blocks`` blocks for ``max_rows`` rows of up to ``max_positions`` positions."""
        return PagedKVCache(
            layers=len(self.layers),
            blocks=blocks,
            groups=self.groups,
            head_dim=self.head_dim,
            max_rows=max_rows,
            max_positions=max_positions,
            dtype=self.cache_dtype,
            device=self.device,
        )

    def __call__(
        self,
        cache: KVCache,
        tokens: Tensor,
        positions: Tensor,
        *,
        kv_len: int,
        slots: Tensor | None = None,
        logits: bool = True,
        embeddings: Tensor | None = None,
    ) -> Tensor | None:
        """Feed ``tokens`` ``(R, T)`` at ``positions`` ``(R, T)``; returns the last token's logits ``(R, V_padded)``.

        Writes the K/V of every fed position into row ``r``'s slot (``slots[r]``, or ``r`` when ``slots`` is None);
        attention reads the first ``kv_len`` positions of a slot (``kv_len > positions.max()``; a flash decode step
        reads each row's own length instead). With ``logits=False`` only the cache is filled (a prefill chunk): the
        last layer stops after writing its K/V and None is returned. ``embeddings`` ``(R, T, h)``, when given, are
        the input instead of the word embeddings of ``tokens`` (a prefill chunk of an image prompt: a VLM's merged
        embeddings, :func:`~sc_lightning.models.vlm.merged_embeddings`).
        """
        rows, width = tokens.shape
        x = self.embedding(tokens) if embeddings is None else embeddings  # (R, T, h)
        slot_of_row = slots if slots is not None else torch.arange(rows, device=self.device)
        call = _Call(
            rows=rows,
            width=width,
            positions=positions,
            rope_tables=(self.cos, self.sin_signed),
            flat_index=cache.flat_index(slot_of_row, positions),
            slots=slots,
            kv_len=kv_len,
            flash=self.flash and slots is None and width == 1 and cache.contiguous_rows,
        )
        last = len(self.layers) - 1
        if self.kernels is not None:
            return self._fused_call(cache, x, call, logits=logits)
        for i, layer in enumerate(self.layers):
            x = self._layer(layer, cache, i, x, call, cache_only=i == last and not logits)
        if not logits:
            return None
        return self._logits(self.final_layernorm(x[:, -1:]))

    def _logits(self, hidden: Tensor) -> Tensor:
        """``(R, V_padded)`` logits of the final-normed last hidden states ``(R, 1, h)``."""
        out, _ = self.output_layer(hidden, weight=self.output_weight)
        return out[:, 0]

    def _fused_call(self, cache: KVCache, x: Tensor, call: _Call, *, logits: bool) -> Tensor | None:
        """The forward on the fused kernels: a layer's output is carried as (residual stream, pending delta)."""
        last = len(self.layers) - 1
        delta = None
        for i, layer in enumerate(self.layers):
            x, delta = self._fused_layer(layer, cache, i, x, delta, call, cache_only=i == last and not logits)
        if not logits:
            return None
        norm = self.final_layernorm
        _, hidden = self.kernels.add_rms_norm(x[:, -1:], delta[:, -1:], norm.weight, _eps(norm, x.dtype))
        return self._logits(hidden)

    def _fused_layer(
        self,
        layer: torch.nn.Module,
        cache: KVCache,
        index: int,
        x: Tensor,
        delta: Tensor | None,
        call: _Call,
        *,
        cache_only: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """One layer on the fused kernels: input ``x + delta``, output ``x' + delta'`` returned as ``(x', delta')``."""
        attention, kernels = layer.self_attention, self.kernels
        rows, width, _ = x.shape
        norm = layer.input_layernorm
        x, hidden = kernels.add_rms_norm(x, delta, norm.weight, _eps(norm, x.dtype))
        qkv, qkv_bias = attention.linear_qkv(hidden)
        if qkv_bias is not None:
            qkv = qkv + qkv_bias
        qkv = qkv.view(rows, width, self.groups, self.heads_per_group + 2, self.head_dim)
        self._normalise_qk(attention, qkv)
        query = kernels.rope_write_kv(qkv, self.angles, call.positions, call.flat_index, cache.flat(index))
        if cache_only:
            return x, None
        if self.kernel_decode_attention and call.slots is None and width == 1:  # a decode step
            shape = (rows, self.groups, self.heads_per_group, self.head_dim)
            layer_cache, tables = cache.decode_inputs(index)
            context = kernels.decode_attention(
                query.view(shape), layer_cache, call.positions[:, 0], self.scale, tables=tables
            )
        else:
            context = self._attend(query, cache.read(index, call.slots, rows, call.kv_len), call)
        out, out_bias = attention.linear_proj(context)
        norm = layer.pre_mlp_layernorm
        x, hidden = kernels.add_rms_norm(
            x, out if out_bias is None else out + out_bias, norm.weight, _eps(norm, x.dtype)
        )
        out, out_bias = layer.mlp(hidden)
        return x, (out if out_bias is None else out + out_bias)

    def _layer(
        self, layer: torch.nn.Module, cache: KVCache, index: int, x: Tensor, call: _Call, *, cache_only: bool
    ) -> Tensor:
        """One transformer layer on ``x`` ``(R, T, h)``; the new tokens' K/V go into layer ``index`` of ``cache``."""
        attention = layer.self_attention
        rows, width, _ = x.shape
        groups, hpg, dim = self.groups, self.heads_per_group, self.head_dim
        qkv, qkv_bias = attention.linear_qkv(layer.input_layernorm(x))
        if qkv_bias is not None:
            qkv = qkv + qkv_bias
        qkv = qkv.view(rows, width, groups, hpg + 2, dim)  # megatron's layout: per group, its query heads, K, V
        self._normalise_qk(attention, qkv)
        qk = qkv[:, :, :, : hpg + 1]  # query heads and key: RoPE in place (t * cos + rotate_half(t) * sin)
        halves_swapped = qk.unflatten(-1, (2, dim // 2)).flip(-2).flatten(-2)
        cos, sin = call.rope
        qk.mul_(cos).addcmul_(halves_swapped, sin)
        flat = cache.flat(index)  # (slots * length, G, 2, D)
        write_kv(flat, call.flat_index, qkv[:, :, :, hpg:].reshape(rows * width, groups, 2, dim))
        if cache_only:
            return x
        context = self._decode_flash(qkv, flat, cache.length, call) if call.flash and self.flash else None
        if context is None:
            query = qkv[:, :, :, :hpg].permute(0, 2, 1, 3, 4).reshape(rows, groups, width * hpg, dim)
            context = self._attend(query, cache.read(index, call.slots, rows, call.kv_len), call)
        out, out_bias = attention.linear_proj(context)
        x = x + (out if out_bias is None else out + out_bias)
        out, out_bias = layer.mlp(layer.pre_mlp_layernorm(x))
        return x + (out if out_bias is None else out + out_bias)

    def _normalise_qk(self, attention: torch.nn.Module, qkv: Tensor) -> None:
        """Apply a QK-norm model's per-head norms to the query heads and keys of ``qkv`` ``(R, T, G, hpg + 2, D)``, in
        place (before RoPE, as megatron's attention does); nothing for a model without them."""
        if self.qk_norm:
            hpg = self.heads_per_group
            qkv[..., :hpg, :] = attention.q_layernorm(qkv[..., :hpg, :])
            qkv[..., hpg, :] = attention.k_layernorm(qkv[..., hpg, :])

    def _decode_flash(self, qkv: Tensor, flat: Tensor, length: int, call: _Call) -> Tensor | None:
        """Flash attention of each row's new token over its slot's positions ``0..p`` (None if the kernel refuses).

        ``flat`` is the layer's cache as rows ``slot * length + position``. After a refusal (e.g. a torch without
        ``seqused_k``) this and later calls take the generic path.
        """
        rows, groups, hpg, dim = call.rows, self.groups, self.heads_per_group, self.head_dim
        query = qkv[:, 0, :, :hpg].reshape(rows, groups * hpg, dim)  # (R, Hq, D), head g * hpg + j
        starts = torch.arange(rows + 1, device=self.device, dtype=torch.int32)
        try:
            out = torch.ops.aten._flash_attention_forward(
                query,
                flat[:, :, 0],  # K (slots * length, G, D)
                flat[:, :, 1],
                starts,  # one query per row
                starts * length,  # row r's keys start at r * length
                1,
                length,
                0.0,
                False,
                False,
                scale=self.scale,
                seqused_k=(call.positions[:, 0] + 1).to(torch.int32),
            )[0]
        except RuntimeError:
            self.flash = False
            return None
        return out.view(rows, 1, groups * hpg * dim)

    def _attend(self, query: Tensor, seen: Tensor, call: _Call) -> Tensor:
        """Attention of ``query`` ``(R, G, T * hpg, D)`` over ``seen`` ``(R, kv_len, G, 2, D)``, the first ``kv_len``
        cached positions of the rows."""
        rows, width = call.rows, call.width
        groups, hpg, dim = self.groups, self.heads_per_group, self.head_dim
        seen = seen.to(self.dtype)  # an fp8 cache is read in the model's dtype (a no-op otherwise)
        key, value = seen[..., 0, :].transpose(1, 2), seen[..., 1, :].transpose(1, 2)  # (R, G, Lk, D)
        bias = call.bias(self.dtype, hpg)
        context = None
        if self.efficient:
            try:
                full_bias = bias.expand(rows, groups, width * hpg, call.kv_len)
                context = torch.ops.aten._scaled_dot_product_efficient_attention(
                    query, key, value, full_bias, False, scale=self.scale
                )[0]
            except RuntimeError:
                self.efficient = False  # e.g. an unsupported head size: the generic path from now on
        if context is None:
            context = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=self.scale)
        # (R, G, T * hpg, D) -> (R, T, G * hpg * D), heads in megatron's order g * hpg + j
        return context.view(rows, groups, width, hpg, dim).permute(0, 2, 1, 3, 4).reshape(rows, width, -1)
