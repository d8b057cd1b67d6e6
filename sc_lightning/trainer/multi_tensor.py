"""Multi-tensor kernels for megatron-core's optimizer where neither Apex nor Transformer Engine provides them.

megatron's mixed-precision optimizer computes the gradient norm, clips, and copies fp32 master weights into the bf16
model through Apex's ``amp_C.multi_tensor_l2norm`` / ``multi_tensor_scale`` (or Transformer Engine's). Without
either it falls back to per-tensor Python loops: the norm converts every tensor's norm to a Python float (one host
synchronisation per parameter, ~200 for a 1B model, each leaving the GPU idle), and every scaled copy makes an fp32
temporary. The functions here have the Apex signatures and do the same work with torch's ``_foreach`` kernels, one
launch per list and no synchronisation; :func:`install_foreach_multi_tensor` puts them where megatron looks them up,
replacing only megatron's own fallbacks.
"""

from __future__ import annotations

import torch
from megatron.core import utils as megatron_utils
from megatron.core.optimizer import clip_grads
from megatron.core.optimizer import optimizer as megatron_optimizer
from torch import Tensor


def foreach_l2norm(
    chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], per_tensor: bool, *args: object
) -> tuple[Tensor, None]:
    """``amp_C.multi_tensor_l2norm``: the 2-norm of all tensors of ``tensor_lists[0]`` together, a 1-element tensor."""
    if per_tensor:
        raise NotImplementedError("per-tensor norms are not used by megatron's optimizer")
    norms = torch._foreach_norm(tensor_lists[0], 2.0)
    return torch.linalg.vector_norm(torch.stack(norms).float(), 2.0).reshape(1), None


def foreach_scale(chunk_size: int, noop_flag: Tensor, tensor_lists: list[list[Tensor]], scale: float) -> None:
    """``amp_C.multi_tensor_scale``: ``dst = src * scale`` for each pair of ``tensor_lists`` (in place when equal)."""
    sources, targets = tensor_lists
    if sources is targets or all(s is t for s, t in zip(sources, targets, strict=True)):
        torch._foreach_mul_(targets, scale)
    elif scale == 1.0:
        torch._foreach_copy_(targets, sources)  # casts fp32 masters into bf16 parameters in one launch
    else:
        torch._foreach_copy_(targets, torch._foreach_mul(sources, scale))


def install_foreach_multi_tensor() -> None:
    """Use :func:`foreach_l2norm` and :func:`foreach_scale` in megatron's optimizer where it fell back to its loops."""
    if clip_grads.l2_norm_impl is megatron_utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = foreach_l2norm
    if clip_grads.multi_tensor_scale_impl is megatron_utils.local_multi_tensor_scale:
        clip_grads.multi_tensor_scale_impl = foreach_scale
    if megatron_optimizer.multi_tensor_scale_impl is megatron_utils.local_multi_tensor_scale:
        megatron_optimizer.multi_tensor_scale_impl = foreach_scale
