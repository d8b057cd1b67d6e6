"""megatron-core's optimizer stack as the trainer's AdamW: bf16 mixed precision, and the distributed optimizer.

Two things need it. **bf16 parameters** train with fp32 master weights, fp32 gradients and fp32 AdamW state:
megatron-core's ``DistributedDataParallel`` gives every parameter an fp32 ``main_grad`` in one contiguous buffer
(``grad_reduce_in_fp32``) and, after each backward, adds the bf16 gradient into it, so accumulation over
micro-batches and chunks is exact to fp32; the mixed-precision optimizer keeps fp32 master copies, clips the global
norm, runs AdamW on them and writes them back into the bf16 parameters. bf16 needs no loss scaling (its exponent
range is fp32's), and megatron uses none for it; neither do we. **The distributed optimizer**
(``policy.megatron_cfg.use_distributed_optimizer``, ZeRO stage 1): each data-parallel rank keeps the main weights
and AdamW moments of only its 1/DP slice of the gradient buffer; DDP reduce-scatters the gradients (each rank gets
the sum of its slice), the rank updates its slice, and the updated weights are all-gathered back into every
replica's model. The update is the same AdamW; the optimizer memory per rank drops by the data-parallel size. It
works for fp32 parameters too (their main weights are the parameters themselves).

:class:`MegatronAdamW` presents the stack as a ``torch.optim.Optimizer`` so Lightning (manual optimization,
checkpoints), the learning-rate schedule and :func:`~sc_lightning.trainer.optim.optimizer_state_to` work unchanged:
its ``param_groups`` and ``state`` are those of the AdamW over the main weights (this rank's slices with the
distributed optimizer). The model's config sets ``calculate_per_token_loss``: the trainer divides by the step's
global count, megatron scales nothing.

bf16 needs CUDA. An fp32 model on the CPU builds and steps the distributed optimizer under
:func:`~sc_lightning.models.cpu_compat.cuda_calls_on` (megatron checks for CUDA tensor types and stages its
checkpoint gathers through ``.cuda()``). Three gaps of megatron 0.16.1's distributed optimizer when neither Apex nor
Transformer Engine is installed (our CPU boxes and the GPU image) are closed here: a fresh one has no AdamW state to
describe for a checkpoint (:meth:`MegatronAdamW._init_state`), its loader copies a ``step`` tensor the loaded
state does not hold (:func:`_restore_without_step_state`), and it restores one ``step`` tensor shared by every
parameter, which torch's AdamW would advance once per parameter (:meth:`MegatronAdamW.load_state_dict`).
"""

from __future__ import annotations

import types
import warnings
from typing import Any

import torch

with warnings.catch_warnings():  # at import: "Transformer Engine and Apex are not installed" (torch fallbacks used)
    warnings.filterwarnings("ignore", message=".*Apex.*")
    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
    from megatron.core.optimizer import get_megatron_optimizer

from sc_lightning.config.model import OptimizerConfig
from sc_lightning.models.cpu_compat import cuda_calls_on
from sc_lightning.trainer.data_parallel import SummedGradients, megatron_ddp
from sc_lightning.trainer.multi_tensor import install_foreach_multi_tensor

# megatron's gradient reduce-scatter and weight all-gather call torch's old collective names, which warn once per
# process and call site; the calls are megatron's to rename
warnings.filterwarnings(
    "ignore", message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated"
)

SHARDING_TYPE = "fully_reshardable"
"""The distributed optimizer's checkpoint form: each parameter's state whole, as a plain optimizer's, so a load on
any tensor-, pipeline- or data-parallel layout reshards it (megatron's other forms reshard only over DP)."""


class MegatronAdamW(SummedGradients, torch.optim.Optimizer):
    """AdamW through megatron-core's optimizer: bf16 parameters with fp32 masters (CUDA), and/or megatron's
    distributed optimizer (``distributed``: each data-parallel rank owns a slice of the main weights and moments).

    One step: ``zero_grad`` → backward × k (gradients land in the fp32 buffer) → ``scale_grads(1 / n)`` →
    ``step()`` (clip to ``opt_cfg.clip_grad``, AdamW, copy back into the model; all-gather the slices when
    distributed). ``last_grad_norm`` is the norm before clipping. A ``step()`` with no ``scale_grads`` since
    ``zero_grad`` changes nothing (PPO's critic warm-up relies on it). Weight decay skips biases and 1-D parameters
    (norm weights), megatron's convention.
    """

    def __init__(self, model: torch.nn.Module, opt_cfg: OptimizerConfig, *, distributed: bool = False) -> None:
        parameter = next(model.parameters())
        bf16 = parameter.dtype == torch.bfloat16
        if bf16 and parameter.device.type != "cuda":
            raise ValueError(
                f"bf16 parameters train through megatron-core's mixed-precision optimizer, which needs a CUDA device; "
                f"this model is on {parameter.device}: set policy.precision (value.precision for a critic) to fp32 for "
                f"a CPU run"
            )
        install_foreach_multi_tensor()  # without Apex, megatron's norm and copies would loop over tensors in Python
        self.device = parameter.device
        self.distributed = distributed
        self.clip_grad = opt_cfg.clip_grad
        self.ddp = megatron_ddp(model, grad_reduce_in_fp32=True, distributed_optimizer=distributed)
        config = MegatronOptimizerConfig(
            optimizer="adam",
            bf16=bf16,
            params_dtype=parameter.dtype,
            use_distributed_optimizer=distributed,
            lr=opt_cfg.lr,
            min_lr=opt_cfg.min_lr,
            weight_decay=opt_cfg.weight_decay,
            adam_beta1=opt_cfg.adam_beta1,
            adam_beta2=opt_cfg.adam_beta2,
            adam_eps=opt_cfg.adam_eps,
            clip_grad=opt_cfg.clip_grad,
        )
        with cuda_calls_on(self.device):
            self.megatron = get_megatron_optimizer(config, [self.ddp])
        inner = self.megatron.optimizer  # torch AdamW over the fp32 main weights
        for group in inner.param_groups:  # megatron's scheduler applies wd_mult; we apply it once, here
            group["weight_decay"] = opt_cfg.weight_decay * group["wd_mult"]
            if self.device.type == "cuda":
                group.update(fused=True, foreach=False)  # one kernel per tensor chunk, not torch's foreach passes
        if distributed:
            for chained in self.megatron.chained_optimizers:
                _restore_without_step_state(chained)
        # torch's bookkeeping, set up over the model's parameters (fp32 main weights sliced by the distributed
        # optimizer are views, which it refuses), then pointed at the inner AdamW's groups and state
        super().__init__([p for p in model.parameters() if p.requires_grad], dict(inner.defaults))
        self._share_inner_groups()

    def master_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each bf16 model parameter with its fp32 master copy (the mixed-precision optimizer, not distributed)."""
        return [
            (low, master)
            for chained in self.megatron.chained_optimizers
            for lows, masters in zip(chained.float16_groups, chained.fp32_from_float16_groups, strict=True)
            for low, master in zip(lows, masters, strict=True)
        ]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fp32 gradient buffer (and any ``.grad`` left over)."""
        self._zero_summed_grads()
        self.megatron.zero_grad(set_to_none=set_to_none)

    def _apply_summed_grads(self) -> float:
        """Clip and apply the gradients to the main weights, then copy (all-gather) them into the model."""
        with cuda_calls_on(self.device):
            _, grad_norm, _ = self.megatron.step()  # bf16 and fp32 have no loss scaler: megatron never skips
        return float(grad_norm)

    def state_dict(self) -> dict[str, Any]:
        """megatron's state: the inner AdamW's ``state_dict`` and the fp32 masters (the distributed optimizer:
        the hyper-parameters only; its weights and moments live in :meth:`sharded_state_dict`)."""
        if self.distributed:
            self._init_state()
        return self.megatron.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` wrote."""
        self.megatron.load_state_dict(state_dict)
        for state in self.megatron.optimizer.state.values():  # the distributed optimizer gives every parameter
            if "step" in state:  # one shared step tensor, which torch's AdamW would then count up once per parameter
                state["step"] = state["step"].clone()
        self._share_inner_groups()

    def sharded_state_dict(self, model_state: dict[str, Any], *, is_loading: bool) -> dict[str, Any]:
        """megatron's distributed-checkpoint form of the state (main weights and moments sharded like the
        parameters of ``model_state``, the model's ``sharded_state_dict``); ``is_loading``: a template to load into."""
        if self.distributed:
            self._init_state()
        metadata = {"distrib_optim_sharding_type": SHARDING_TYPE}
        with cuda_calls_on(self.device):
            return self.megatron.sharded_state_dict(model_state, is_loading=is_loading, metadata=metadata)

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`sharded_state_dict` saved, as loaded by ``dist_checkpointing``."""
        with cuda_calls_on(self.device), torch.no_grad():  # fp32 main weights are views of the parameters
            self.load_state_dict(state)

    def _init_state(self) -> None:
        """Give every main weight without state zero AdamW state at step 0, as torch's AdamW creates it on its first
        step (which then behaves the same), so the distributed optimizer can describe its state before any step
        (a checkpoint during PPO's critic warm-up, the template a load fills)."""
        inner = self.megatron.optimizer
        for group in inner.param_groups:
            on_param = group.get("fused") or group.get("capturable")  # where torch's AdamW keeps its step counts
            for param in group["params"]:
                if not inner.state[param]:
                    step = torch.zeros((), dtype=torch.float32, device=param.device if on_param else "cpu")
                    zeros = {name: torch.zeros_like(param) for name in ("exp_avg", "exp_avg_sq")}
                    inner.state[param] = {"step": step, **zeros}

    def _share_inner_groups(self) -> None:
        """Alias the inner AdamW's ``param_groups`` and ``state`` (its ``load_state_dict`` replaces both objects),
        so a schedule setting ``lr`` here sets it where the step reads it."""
        self.param_groups = self.megatron.optimizer.param_groups
        self.state = self.megatron.optimizer.state


def _restore_without_step_state(optimizer: Any) -> None:
    """Let ``optimizer`` (a megatron ``DistributedOptimizer``) load its checkpointed per-parameter state.

    Without Apex/TE it keeps torch AdamW's ``step`` in each parameter's state and restores it from the saved
    hyper-parameters; its per-parameter loader then copies every state entry from the loaded tensors, which hold
    no ``step`` (KeyError). This instance's loader copies what was loaded.
    """

    def set_state(self: Any, model_param: torch.nn.Parameter, tensors: dict[str, torch.Tensor]) -> None:
        """Copy the loaded main weight and moments of ``model_param`` into this rank's slice of its state."""
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        targets = {"param": main_param, **self.optimizer.state[main_param]}
        for name, tensor in tensors.items():
            targets[name].copy_(tensor)

    optimizer._set_main_param_and_optimizer_states = types.MethodType(set_state, optimizer)
