"""Triton kernels of :mod:`sc_lightning.models.fused`: SwiGLU and RoPE, forward and backward, one pass each.

Imported only where Triton exists (GPU builds of torch ship it); each function takes and returns CUDA tensors and
computes in fp32 registers, rounding once on the store. Launch shapes depend only on the model's widths, never on
the number of tokens, so nothing recompiles as RL's micro-batch lengths vary (Triton specialises a kernel on dtypes
and on integer arguments' divisibility by 16, a handful of variants at most).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

_BLOCK = 1024  # elements of one row a SwiGLU program handles


@triton.jit
def _swiglu_forward_kernel(x_ptr, out_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * 2 * width + cols, mask=mask).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * width + width + cols, mask=mask).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * width + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_backward_kernel(x_ptr, grad_ptr, grad_x_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * 2 * width + cols, mask=mask).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * width + width + cols, mask=mask).to(tl.float32)
    grad = tl.load(grad_ptr + row * width + cols, mask=mask).to(tl.float32)
    sig = tl.sigmoid(gate)
    grad_gate = grad * up * sig * (1.0 + gate * (1.0 - sig))  # d silu(g) / dg = s (1 + g (1 - s))
    grad_up = grad * gate * sig
    dtype = grad_x_ptr.dtype.element_ty
    tl.store(grad_x_ptr + row * 2 * width + cols, grad_gate.to(dtype), mask=mask)
    tl.store(grad_x_ptr + row * 2 * width + width + cols, grad_up.to(dtype), mask=mask)


def swiglu_forward(x: Tensor) -> Tensor:
    """``silu(gate) * up`` of ``x = [gate | up]`` ``[..., 2f]`` → ``[..., f]``."""
    x = x.contiguous()
    width = x.size(-1) // 2
    rows = x.numel() // (2 * width)
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    if rows:
        _swiglu_forward_kernel[(rows, triton.cdiv(width, _BLOCK))](x, out, width, BLOCK=_BLOCK)
    return out


def swiglu_backward(x: Tensor, grad: Tensor) -> Tensor:
    """The gradient of :func:`swiglu_forward` at ``x`` for the output gradient ``grad``."""
    x, grad = x.contiguous(), grad.contiguous()
    width = x.size(-1) // 2
    rows = x.numel() // (2 * width)
    grad_x = torch.empty_like(x)
    if rows:
        _swiglu_backward_kernel[(rows, triton.cdiv(width, _BLOCK))](x, grad, grad_x, width, BLOCK=_BLOCK)
    return grad_x


@triton.jit
def _rope_kernel(
    t_ptr,
    freqs_ptr,
    out_ptr,
    batch,
    heads,
    half,
    stride_s,
    stride_b,
    stride_h,
    head_dim,
    HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)  # s * batch + b
    s, b = token // batch, token % batch
    head = tl.arange(0, HEADS)[:, None]
    dim = tl.arange(0, HALF)[None, :]
    mask = (head < heads) & (dim < half)
    angle_first = tl.load(freqs_ptr + s * 2 * half + dim, mask=dim < half)
    angle_second = tl.load(freqs_ptr + s * 2 * half + half + dim, mask=dim < half)
    cos_first, sin_first = tl.cos(angle_first), tl.sin(angle_first)
    cos_second, sin_second = tl.cos(angle_second), tl.sin(angle_second)
    source = t_ptr + s * stride_s + b * stride_b + head * stride_h + dim
    first = tl.load(source, mask=mask).to(tl.float32)
    second = tl.load(source + half, mask=mask).to(tl.float32)
    if BACKWARD:  # the transpose of the rotation below
        out_first = first * cos_first + second * sin_second
        out_second = second * cos_second - first * sin_first
    else:  # t * cos + rotate_half(t) * sin, rotate_half(t) = [-second | first]
        out_first = first * cos_first - second * sin_first
        out_second = second * cos_second + first * sin_second
    # out is contiguous [s, b, heads, head_dim]; head_dim = 2 * half here (a pass-through tail is copied by the caller)
    target = out_ptr + (token * heads + head) * head_dim + dim
    dtype = out_ptr.dtype.element_ty
    tl.store(target, out_first.to(dtype), mask=mask)
    tl.store(target + half, out_second.to(dtype), mask=mask)


def rope(t: Tensor, freqs: Tensor, *, backward: bool = False) -> Tensor:
    """RoPE of ``t`` ``[s, b, h, d]`` (any strides, unit stride in ``d``) by angles ``freqs`` ``[s, 1, 1, rot]``.

    Returns a contiguous tensor; dims past ``rot`` pass through. ``backward`` applies the transposed rotation (the
    gradient with respect to ``t``).
    """
    seq, batch, heads, head_dim = t.shape
    rot = freqs.size(-1)
    if freqs.size(0) != seq:
        raise ValueError(f"RoPE angles cover {freqs.size(0)} positions, the input has {seq}")
    if t.stride(-1) != 1:
        t = t.contiguous()
    angles = freqs.reshape(seq, rot).float().contiguous()
    out = torch.empty((seq, batch, heads, head_dim), dtype=t.dtype, device=t.device)
    if rot < head_dim:
        out[..., rot:] = t[..., rot:]
    rotated = t if rot == head_dim else t[..., :rot]
    if out.numel():
        _rope_kernel[(seq * batch,)](
            rotated,
            angles,
            out,
            batch,
            heads,
            rot // 2,
            rotated.stride(0),
            rotated.stride(1),
            rotated.stride(2),
            head_dim,
            HEADS=triton.next_power_of_2(heads),
            HALF=triton.next_power_of_2(rot // 2),
            BACKWARD=backward,
        )
    return out


@triton.jit
def _logprob_forward_kernel(
    logits_ptr, target_ptr, out_ptr, lse_ptr, vocab, real_vocab, inv_temperature, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * vocab
    running_max = tl.full((BLOCK,), float("-inf"), tl.float32)
    running_sum = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, vocab, BLOCK):  # online log-sum-exp, lane by lane
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < real_vocab, other=float("-inf")).to(tl.float32) * inv_temperature
        new_max = tl.maximum(running_max, x)
        scale = tl.where(new_max == float("-inf"), 0.0, tl.exp(running_max - new_max))
        running_sum = running_sum * scale + tl.where(x == float("-inf"), 0.0, tl.exp(x - new_max))
        running_max = new_max
    top = tl.max(running_max, axis=0)
    lse = top + tl.log(tl.sum(running_sum * tl.exp(running_max - top), axis=0))
    target = tl.load(target_ptr + row)
    picked = tl.load(base + target).to(tl.float32) * inv_temperature
    tl.store(out_ptr + row, picked - lse)
    tl.store(lse_ptr + row, lse)


@triton.jit
def _logprob_backward_kernel(
    logits_ptr, target_ptr, lse_ptr, grad_ptr, grad_logits_ptr, vocab, real_vocab, inv_temperature, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    lse = tl.load(lse_ptr + row)
    grad = tl.load(grad_ptr + row).to(tl.float32)
    target = tl.load(target_ptr + row)
    dtype = grad_logits_ptr.dtype.element_ty
    for start in range(0, vocab, BLOCK):  # d (x_t - lse) / d x_j = [j == t] - softmax_j, times 1/T
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * vocab + cols, mask=cols < real_vocab, other=float("-inf")).to(tl.float32)
        softmax = tl.exp(x * inv_temperature - lse)
        out = grad * inv_temperature * (tl.where(cols == target, 1.0, 0.0) - softmax)
        tl.store(grad_logits_ptr + row * vocab + cols, out.to(dtype), mask=cols < vocab)


_VOCAB_BLOCK = 2048  # vocabulary entries a log-prob program reads at a time


def logprob_forward(logits: Tensor, targets: Tensor, real_vocab: int, temperature: float) -> tuple[Tensor, Tensor]:
    """``(log softmax(logits / T)[target], log-sum-exp)`` per row of ``logits`` ``(N, V)``, fp32, one read of them.

    Columns from ``real_vocab`` on (padding rows of the embedding) are left out of the softmax.
    """
    logits, targets = logits.contiguous(), targets.contiguous()
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        _logprob_forward_kernel[(rows,)](
            logits, targets, out, lse, vocab, real_vocab, 1.0 / temperature, BLOCK=_VOCAB_BLOCK
        )
    return out, lse


def logprob_backward(
    logits: Tensor, targets: Tensor, lse: Tensor, grad: Tensor, real_vocab: int, temperature: float
) -> Tensor:
    """The gradient of :func:`logprob_forward`'s log-probs with respect to ``logits``, in their dtype."""
    logits, grad = logits.contiguous(), grad.contiguous()
    rows, vocab = logits.shape
    grad_logits = torch.empty_like(logits)
    if rows:
        _logprob_backward_kernel[(rows,)](
            logits, targets, lse, grad, grad_logits, vocab, real_vocab, 1.0 / temperature, BLOCK=_VOCAB_BLOCK
        )
    return grad_logits
