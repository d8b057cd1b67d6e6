"""Data parallelism in the train pump: each data-parallel rank trains its share of a step's groups.

    step's groups ──► share_of_groups(rank)   whole groups, balanced by tokens, the same split on every rank
    each rank: micro-batches of its share → raw-sum gradients (megatron-core DDP adds them into ``main_grad``)
    finish: counts and metrics summed over ranks (StepTotals) → gradients ÷ the global count → DDP all-reduce
            (a sum) → one clipped optimizer step, identical on every rank

Because gradients are raw sums normalised once by the step's global valid count, the update does not depend on
how the groups were split: DP=2 trains what one process trains (within float summation order). Tensor- and
pipeline-parallel peers of a data-parallel rank train the same rows.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from megatron.core import parallel_state

from sc_lightning.controller.api import GroupMeta
from sc_lightning.trainer.grad_clip import clip_model_parallel_grads

with warnings.catch_warnings():  # at import: "Transformer Engine and Apex are not installed" (torch fallbacks used)
    warnings.filterwarnings("ignore", message=".*Apex.*")
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads


def data_parallel_size() -> int:
    """The number of data-parallel replicas (1 before megatron's parallel state is initialised)."""
    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_data_parallel_world_size()


def data_parallel_rank() -> int:
    """This process's data-parallel rank (0 before megatron's parallel state is initialised)."""
    if not parallel_state.model_parallel_is_initialized():
        return 0
    return parallel_state.get_data_parallel_rank()


def data_parallel_representative() -> bool:
    """Whether this rank speaks for its data-parallel replica: its first tensor- and pipeline-parallel rank."""
    if not parallel_state.model_parallel_is_initialized():
        return True
    return (
        parallel_state.get_tensor_model_parallel_rank() == 0 and parallel_state.get_pipeline_model_parallel_rank() == 0
    )


def parallel_layout() -> str:
    """The trainer's ranks as megatron split them, e.g. ``4 ranks = TP 2 x PP 1 x DP 2``."""
    if not parallel_state.model_parallel_is_initialized():
        return "1 rank (megatron's parallel state not initialised)"
    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    return f"{torch.distributed.get_world_size()} ranks = TP {tp} x PP {pp} x DP {data_parallel_size()}"


def data_parallel_group() -> Any:
    """The data-parallel process group, or None with one replica."""
    return parallel_state.get_data_parallel_group() if data_parallel_size() > 1 else None


Reduce = Callable[[torch.Tensor], torch.Tensor]
"""A sum over the processes that hold the rest of a step (the data-parallel ranks)."""


def sum_over_data_parallel(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over the data-parallel ranks (itself with one replica); every rank gets the sum."""
    group = data_parallel_group()
    if group is None:
        return tensor
    total = tensor.clone()
    torch.distributed.all_reduce(total, group=group)
    return total


def share_of_groups(groups: Sequence[GroupMeta], rank: int, size: int) -> list[GroupMeta]:
    """The groups data-parallel rank ``rank`` of ``size`` trains: whole groups, longest first to the least-loaded
    rank (by tokens, ties to the lower rank), in their original order. Every rank computes the same split."""
    if size == 1:
        return list(groups)
    load = [0] * size
    owner = {}
    for index in sorted(range(len(groups)), key=lambda i: (-sum(groups[i].sequence_lengths), i)):
        target = min(range(size), key=lambda r: (load[r], r))
        owner[index] = target
        load[target] += sum(groups[index].sequence_lengths)
    return [group for index, group in enumerate(groups) if owner[index] == rank]


def transformer_config_of(model: torch.nn.Module) -> Any:
    """The megatron ``TransformerConfig`` a GPTModel (or a critic built on one) carries."""
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"{type(model).__name__} carries no megatron TransformerConfig (.config)")
    return config


def megatron_ddp(
    model: torch.nn.Module, *, grad_reduce_in_fp32: bool, distributed_optimizer: bool = False
) -> DistributedDataParallel:
    """megatron-core's DDP over ``model``: every gradient accumulates into a ``main_grad`` buffer, and
    ``finish_grad_sync`` sums the buffers over the data-parallel group (the model's config sets
    ``calculate_per_token_loss``, so megatron scales nothing); for megatron's ``distributed_optimizer`` it
    reduce-scatters them instead (each rank gets the sum of the slice it updates). On the CPU its buffers are CPU
    tensors."""
    from sc_lightning.models.cpu_compat import cuda_calls_on

    device = next(model.parameters()).device
    with cuda_calls_on(device):
        return DistributedDataParallel(
            transformer_config_of(model),
            DistributedDataParallelConfig(
                grad_reduce_in_fp32=grad_reduce_in_fp32,
                overlap_grad_reduce=False,
                use_distributed_optimizer=distributed_optimizer,
            ),
            module=model,
        )


class SummedGradients:
    """An optimizer's side of megatron DDP's gradient buffer (a mixin before the optimizer class): zero the buffer,
    scale it once by the step's normaliser, sum it over the data-parallel ranks, apply it.

    One step: ``zero_grad`` → backward × k (gradients land in the buffer) → ``scale_grads(1 / n)`` → ``step()``.
    ``last_grad_norm`` is the norm before clipping. A ``step()`` without ``scale_grads`` since ``zero_grad`` changes
    nothing (PPO's critic warm-up relies on it). Subclasses set ``ddp`` and implement :meth:`_apply_summed_grads`.
    """

    ddp: DistributedDataParallel
    clip_grad: float  # the norm its step clips the summed gradients to
    last_grad_norm: float = 0.0
    _grads_scaled: bool = False

    def _zero_summed_grads(self) -> None:
        self.ddp.zero_grad_buffer()
        self._grads_scaled = False

    def scale_grads(self, factor: float) -> None:
        """Multiply this rank's accumulated gradients by ``factor`` (the step's global normaliser, known at its end)."""
        self.ddp.scale_gradients(factor)
        self._grads_scaled = True

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Sum the scaled gradients over the data-parallel ranks, then clip and apply them."""
        loss = closure() if closure is not None else None
        if not self._grads_scaled:
            return loss
        finalize_model_grads([self.ddp])  # the data-parallel sum, and tied embeddings across pipeline stages
        self.last_grad_norm = self._apply_summed_grads()
        self._grads_scaled = False
        return loss

    def _apply_summed_grads(self) -> float:
        """Clip and apply the summed gradients; returns the norm before clipping."""
        raise NotImplementedError


class DataParallelAdamW(SummedGradients, torch.optim.AdamW):
    """torch's AdamW over fp32 parameters whose gradients megatron-core's DDP sums across data-parallel ranks.

    ``step()`` all-reduces, clips the whole model's norm to ``clip_grad`` and applies AdamW. Its ``state_dict`` is
    plain AdamW's, so checkpoints move between data-parallel sizes.
    """

    def __init__(self, model: torch.nn.Module, param_groups: list[dict[str, Any]], clip_grad: float, **adam: Any):
        torch.optim.AdamW.__init__(self, param_groups, **adam)
        self.ddp = megatron_ddp(model, grad_reduce_in_fp32=True)
        self.clip_grad = clip_grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the DDP gradient buffer (and any ``.grad``)."""
        self._zero_summed_grads()
        super().zero_grad(set_to_none=set_to_none)

    def _apply_summed_grads(self) -> float:
        params = [p for group in self.param_groups for p in group["params"]]
        for param in params:
            param.grad = param.main_grad
        grad_norm = clip_model_parallel_grads(params, self.clip_grad)
        torch.optim.AdamW.step(self)
        return grad_norm
