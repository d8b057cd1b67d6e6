"""Torch SDPA core attention for megatron-core and the GPT layer spec that uses it (CPU and GPU alike).

megatron-core's local ``DotProductAttention`` materialises the full ``[b, h, s, s]`` score matrix in a CUDA global
buffer; :class:`SDPACoreAttention` hands the same computation to ``torch.nn.functional.scaled_dot_product_attention``
instead, which runs on CPU and picks flash/memory-efficient kernels on GPUs without Transformer Engine (about 2x
faster and less than half the memory of the stock module on an H200, see ``docs/gpu.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide
from torch import Tensor

from sc_lightning.models.fused import FusedSwiGLU
from sc_lightning.models.norms import TorchNorm


class SDPACoreAttention(MegatronModule):
    """Drop-in replacement for megatron's ``DotProductAttention`` built on ``F.scaled_dot_product_attention``.

    Takes query ``[sq, b, np, hn]`` and key/value ``[sk, b, ng, hn]`` (this rank's heads and KV groups), returns
    ``[sq, b, np * hn]``. Masking follows megatron: an explicit ``attention_mask`` (bool, True = masked out) is used
    as given; without one, a causal layer masks the future (bottom-right aligned when ``sq != sk``, as in a KV-cache
    decode step). Grouped-query attention is handled by SDPA's ``enable_gqa`` (no K/V copies).
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPACoreAttention does not support context parallelism (context_parallel_size > 1)")
        if config.softmax_type != "vanilla":
            raise ValueError(f"SDPACoreAttention supports softmax_type='vanilla' only, got {config.softmax_type!r}")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp_size = pg_collection.tp.size()
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        self.num_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.num_groups_per_partition = divide(config.num_query_groups, tp_size)
        self.hidden_size_per_partition = divide(config.kv_channels * config.num_attention_heads, tp_size)
        # apply_query_key_layer_scaling only moves a factor between the matmul and megatron's fp32 softmax; the
        # product is the plain scale, which is what SDPA applies.
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        """Attention of ``query`` over ``key``/``value``; returns the context ``[sq, b, np * hn]``."""
        if packed_seq_params is not None:
            raise NotImplementedError("SDPACoreAttention does not support packed sequences (thd format)")
        if attention_bias is not None:
            raise NotImplementedError("SDPACoreAttention does not support an additive attention_bias")
        sq, sk = query.size(0), key.size(0)
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        q = query.permute(1, 2, 0, 3)  # (b, np, sq, hn)
        k = key.permute(1, 2, 0, 3)  # (b, ng, sk, hn)
        v = value.permute(1, 2, 0, 3)  # (b, ng, sk, hn)
        attn_mask, is_causal = None, False
        if attention_mask is not None:
            attn_mask = ~attention_mask.to(torch.bool)  # megatron: True = masked out; SDPA: True = attend
        elif mask_type == AttnMaskType.causal and sq > 1:
            if sq == sk:
                is_causal = True
            else:
                attn_mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        dropout_p = self.dropout_p if self.training else 0.0
        # like megatron, draw attention dropout from the model-parallel RNG stream (it differs per TP rank)
        rng = tensor_parallel.get_cuda_rng_tracker().fork() if dropout_p > 0 else contextlib.nullcontext()
        with rng:
            context = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=self.softmax_scale,
                enable_gqa=self.num_heads_per_partition != self.num_groups_per_partition,
            )  # (b, np, sq, hn)
        return context.permute(2, 0, 1, 3).reshape(sq, context.size(0), self.hidden_size_per_partition)


def gpt_layer_spec_sdpa(*, fused_swiglu: bool = False, qk_layernorm: bool = False) -> ModuleSpec:
    """megatron-core's local GPT layer spec (RMSNorm, column/row-parallel linears) with SDPA core attention and
    :class:`~sc_lightning.models.norms.TorchNorm` norms (which allow sequence parallelism).

    With ``qk_layernorm`` each head's query and key pass through a TorchNorm over ``head_dim`` before RoPE (Qwen3's
    QK-norm; the config must set ``qk_layernorm`` too).

    With ``fused_swiglu`` the MLP's activation is :class:`~sc_lightning.models.fused.FusedSwiGLU` (the config must
    then set ``use_te_activation_func``, the MLP's switch for an activation submodule).
    """
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=qk_layernorm)
    attention = spec.submodules.self_attention
    norms = {"q_layernorm": TorchNorm, "k_layernorm": TorchNorm} if qk_layernorm else {}
    attention_submodules = dataclasses.replace(attention.submodules, core_attention=SDPACoreAttention, **norms)
    changes = {
        "self_attention": dataclasses.replace(attention, submodules=attention_submodules),
        "input_layernorm": TorchNorm,
        "pre_mlp_layernorm": TorchNorm,
    }
    if fused_swiglu:
        mlp = spec.submodules.mlp
        mlp_submodules = dataclasses.replace(mlp.submodules, activation_func=ModuleSpec(module=FusedSwiGLU))
        changes["mlp"] = dataclasses.replace(mlp, submodules=mlp_submodules)
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, **changes))
