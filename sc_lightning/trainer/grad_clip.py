"""Gradient clipping by the norm of the whole model's gradient, when the model is split over tensor/pipeline ranks.

``torch.nn.utils.clip_grad_norm_`` sees one rank's tensors only. Under tensor (or pipeline) parallelism a rank holds
shards of some parameters and full copies of others (the layer norms are replicated on every tensor-parallel rank),
so the model's norm is the sum of squares over the model-parallel group with each replicated parameter counted once:
megatron-core's own predicates (``param_is_not_tensor_parallel_duplicate``, ``param_is_not_shared``) pick the
tensors a rank contributes, and one all-reduce adds them up. Every rank then scales its gradients by the same factor.
(megatron's ``get_grad_norm_fp32`` and ``clip_grad_by_total_norm_fp32`` do the same on CUDA only: the mixed-precision
optimizer uses them on a GPU.)
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared


def model_parallel_grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The fp32 2-norm of the whole model's gradient, from this rank's ``params`` (with gradients) and its peers'."""
    counted = [p.grad for p in params if param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p)]
    device = params[0].grad.device if params else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float32, device=device)
    if counted:
        squares = torch.nn.utils.get_total_norm(counted, 2.0).float() ** 2
    if parallel_state.model_parallel_is_initialized() and parallel_state.get_model_parallel_group().size() > 1:
        torch.distributed.all_reduce(squares, group=parallel_state.get_model_parallel_group())
    return squares.sqrt()


def clip_model_parallel_grads(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Scale the gradients of ``params`` so that the whole model's gradient norm is at most ``max_norm``; returns the
    norm before clipping (the same on every rank of the model-parallel group)."""
    total = model_parallel_grad_norm(params)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)
