"""Fused SwiGLU, RoPE and target log-probs for megatron-core's local layer spec on a GPU, without Transformer Engine.

megatron-core fuses both only through Transformer Engine (RoPE) or a ``torch.compile``d function specialised to one
shape (SwiGLU); unfused, each is half a dozen elementwise kernels per layer and pass. Here each is one Triton kernel
per pass (:mod:`sc_lightning.models.triton_kernels`) behind an autograd function: the backward recomputes from the
saved input instead of keeping intermediates. ``torch.compile`` with dynamic shapes was tried first and rejected:
its kernels ran at a quarter of the HBM bandwidth, and the 0/1-size and dtype guards of a trainer plus an engine in
one process exhausted torch's recompile limit. On the CPU (or without Triton) the same math runs as plain torch ops,
which is what the CPU tests compare with megatron's unfused path.

:func:`target_logprobs` replaces megatron's fp32 cross entropy at TP=1 (:mod:`sc_lightning.models.logprobs`). The
others plug into megatron's own extension points:

- :class:`FusedSwiGLU` is the MLP's ``activation_func`` submodule, applied to the whole ``linear_fc1`` output
  (megatron's ``use_te_activation_func`` path, which takes any such module);
- :func:`fused_rope` is the ``fused_apply_rotary_pos_emb`` that megatron's ``rope_utils`` calls when
  ``apply_rope_fusion`` is set and that it imports from Transformer Engine when present;
  :func:`install_fused_rope` provides it where Transformer Engine does not.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor


@functools.cache
def triton_module(name: str) -> ModuleType | None:
    """The module of Triton kernels called ``name`` (imported once), or None where Triton is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _triton_kernels() -> ModuleType | None:
    """:mod:`sc_lightning.models.triton_kernels`, or None where Triton is not installed."""
    return triton_module("sc_lightning.models.triton_kernels")


def _on_triton(x: Tensor) -> ModuleType | None:
    """The Triton kernels when ``x`` is a CUDA tensor and Triton exists, else None (plain torch ops)."""
    return _triton_kernels() if x.is_cuda else None


class _SwiGLUFunction(torch.autograd.Function):
    """SwiGLU on the Triton kernels; saves only its input."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        """``silu(gate) * up`` of ``x``, saving ``x``."""
        ctx.save_for_backward(x)
        return _triton_kernels().swiglu_forward(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        """The gradient with respect to ``x``, recomputed from it."""
        (x,) = ctx.saved_tensors
        return _triton_kernels().swiglu_backward(x, grad)


class _RopeFunction(torch.autograd.Function):
    """RoPE on the Triton kernels; the backward is the transposed rotation (nothing saved but the angles)."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, freqs: Tensor) -> Tensor:
        """``t`` rotated by ``freqs``, saving the angles."""
        ctx.save_for_backward(freqs)
        return _triton_kernels().rope(t, freqs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        """``grad`` rotated back (the angles get no gradient)."""
        (freqs,) = ctx.saved_tensors
        return _triton_kernels().rope(grad, freqs, backward=True), None


class _TargetLogprobFunction(torch.autograd.Function):
    """Log-probs of the targets on the Triton kernels; saves the logits (model dtype) and one fp32 per row."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, real_vocab: int, temperature: float) -> Tensor:
        """The targets' log-probs, saving the logits and each row's log-sum-exp."""
        out, lse = _triton_kernels().logprob_forward(logits, targets, real_vocab, temperature)
        ctx.save_for_backward(logits, targets, lse)
        ctx.real_vocab, ctx.temperature = real_vocab, temperature
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        """The gradient with respect to the logits, in their dtype."""
        logits, targets, lse = ctx.saved_tensors
        return (
            _triton_kernels().logprob_backward(logits, targets, lse, grad, ctx.real_vocab, ctx.temperature),
            None,
            None,
            None,
        )


def target_logprobs(logits: Tensor, targets: Tensor, real_vocab: int, temperature: float = 1.0) -> Tensor | None:
    """``log softmax(logits / temperature)[target]`` per row of ``logits`` ``(N, V)`` in fp32, on the Triton
    kernels (one read of the logits forward, one read and one write backward), or None off the GPU.

    megatron's cross entropy instead copies the logits to fp32 and makes five more full passes, keeping an fp32
    softmax for the backward. Columns from ``real_vocab`` on are left out of the softmax.
    """
    if _on_triton(logits) is None:
        return None
    return _TargetLogprobFunction.apply(logits, targets, real_vocab, temperature)


def swiglu(x: Tensor) -> Tensor:
    """``silu(gate) * up`` where ``x`` is ``[..., 2f]`` = ``[gate | up]`` (megatron's fc1 layout)."""
    if _on_triton(x) is not None:
        return _SwiGLUFunction.apply(x)
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


def rope(t: Tensor, freqs: Tensor) -> Tensor:
    """megatron's non-interleaved RoPE: ``t * cos + rotate_half(t) * sin`` over the first ``freqs.size(-1)`` dims."""
    if _on_triton(t) is not None:
        return _RopeFunction.apply(t, freqs)
    rot_dim = freqs.size(-1)
    rotated, passed = t[..., :rot_dim], t[..., rot_dim:]
    first, second = torch.chunk(rotated, 2, dim=-1)
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    out = rotated * cos + torch.cat((-second, first), dim=-1) * sin
    return torch.cat((out, passed), dim=-1)


class FusedSwiGLU(MegatronModule):
    """SwiGLU over megatron's gated ``linear_fc1`` output ``[s, b, 2f]`` → ``[s, b, f]``, one kernel a pass on CUDA."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config=config)

    def forward(self, x: Tensor) -> Tensor:
        """``silu(gate) * up`` of ``x = [gate | up]``."""
        return swiglu(x)


def fused_rope(t: Tensor, freqs: Tensor, interleaved: bool = False) -> Tensor:
    """RoPE of ``t`` ``[s, b, h, d]`` by the angles ``freqs`` ``[s, 1, 1, rot_dim]`` (fp32), as megatron computes it.

    Has the signature megatron's ``rope_utils`` calls ``fused_apply_rotary_pos_emb`` with; only the non-interleaved
    layout (Llama, Qwen) is supported.
    """
    if interleaved:
        raise NotImplementedError("fused_rope supports rotary_interleaved=False only")
    return rope(t, freqs)


def install_fused_rope() -> bool:
    """Make :func:`fused_rope` megatron's fused RoPE where Transformer Engine provides none; True when it is in use.

    Process-wide (megatron looks the function up in ``rope_utils`` at every call), and harmless to models built
    without ``apply_rope_fusion``, which never call it.
    """
    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = fused_rope
    return rope_utils.fused_apply_rotary_pos_emb is fused_rope
