"""bf16 training with fp32 master weights, fp32 gradients and fp32 AdamW state: megatron-core's optimizer stack.

The model keeps bf16 parameters and computes in bf16. megatron-core's ``DistributedDataParallel`` gives every
parameter an fp32 ``main_grad`` in one contiguous buffer (``grad_reduce_in_fp32``) and, after each backward, adds
the bf16 gradient into it, so accumulation over micro-batches and chunks is exact to fp32. Its mixed-precision
optimizer (``get_megatron_optimizer`` with ``bf16=True``: ``Float16OptimizerWithFloat16Params``) keeps fp32 master
copies of the parameters, copies the main grads onto them, clips the global norm, runs AdamW on the fp32 copies and
writes them back into the bf16 parameters. bf16 needs no loss scaling (its exponent range is fp32's), and megatron
uses none for it; neither do we. With several data-parallel ranks, DDP's ``finish_grad_sync`` sums the fp32 gradients
over them (the model's config sets ``calculate_per_token_loss``: the trainer divides by the step's global count).

:class:`MixedPrecisionAdamW` presents that stack as a ``torch.optim.Optimizer`` so Lightning (manual optimization,
checkpoints), the learning-rate schedule and :func:`~sc_lightning.trainer.optim.optimizer_state_to` work unchanged:
its ``param_groups`` and ``state`` are those of the AdamW over the fp32 masters. The stack needs CUDA (megatron
allocates its buffers on ``torch.cuda.current_device()``); a CPU run trains in fp32 with plain AdamW.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

with warnings.catch_warnings():  # at import: "Transformer Engine and Apex are not installed" (torch fallbacks used)
    warnings.filterwarnings("ignore", message=".*Apex.*")
    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
    from megatron.core.optimizer import get_megatron_optimizer

from sc_lightning.config.model import OptimizerConfig
from sc_lightning.trainer.data_parallel import SummedGradients, megatron_ddp
from sc_lightning.trainer.multi_tensor import install_foreach_multi_tensor


class MixedPrecisionAdamW(SummedGradients, torch.optim.Optimizer):
    """AdamW on fp32 master copies of a bf16 megatron model, with fp32 gradient accumulation (CUDA only).

    One step: ``zero_grad`` → backward × k (gradients land in the fp32 buffer) → ``scale_grads(1 / n)`` →
    ``step()`` (clip to ``opt_cfg.clip_grad``, AdamW, copy back to bf16). ``last_grad_norm`` is the norm before
    clipping. A ``step()`` with no ``scale_grads`` since ``zero_grad`` changes nothing, as torch's AdamW skips
    parameters without a gradient (PPO's critic warm-up relies on it). Weight decay skips biases and 1-D parameters
    (norm weights), megatron's convention.
    """

    def __init__(self, model: torch.nn.Module, opt_cfg: OptimizerConfig) -> None:
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ValueError(
                f"bf16 parameters train through megatron-core's mixed-precision optimizer, which needs a CUDA device; "
                f"this model is on {device}: set policy.precision (value.precision for a critic) to fp32 for a CPU run"
            )
        install_foreach_multi_tensor()  # without Apex, megatron's norm and copies would loop over tensors in Python
        self.ddp = megatron_ddp(model, grad_reduce_in_fp32=True)
        self.clip_grad = opt_cfg.clip_grad
        self.megatron = get_megatron_optimizer(
            MegatronOptimizerConfig(
                optimizer="adam",
                bf16=True,
                params_dtype=torch.bfloat16,
                lr=opt_cfg.lr,
                min_lr=opt_cfg.min_lr,
                weight_decay=opt_cfg.weight_decay,
                adam_beta1=opt_cfg.adam_beta1,
                adam_beta2=opt_cfg.adam_beta2,
                adam_eps=opt_cfg.adam_eps,
                clip_grad=opt_cfg.clip_grad,
            ),
            [self.ddp],
        )
        inner = self.megatron.optimizer  # torch AdamW over the fp32 masters
        for group in inner.param_groups:  # megatron's scheduler applies wd_mult; we apply it once, here
            group["weight_decay"] = opt_cfg.weight_decay * group["wd_mult"]
            group.update(fused=True, foreach=False)  # one kernel per tensor chunk, not torch's foreach passes
        super().__init__([p for group in inner.param_groups for p in group["params"]], dict(inner.defaults))
        self._share_inner_groups()

    def master_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each bf16 model parameter with its fp32 master copy."""
        return [
            (low, master)
            for chained in self.megatron.chained_optimizers
            for lows, masters in zip(chained.float16_groups, chained.fp32_from_float16_groups, strict=True)
            for low, master in zip(lows, masters, strict=True)
        ]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fp32 gradient buffer (and any bf16 ``.grad`` left over)."""
        self._zero_summed_grads()
        self.megatron.zero_grad(set_to_none=set_to_none)

    def _apply_summed_grads(self) -> float:
        """Clip and apply the gradients to the fp32 masters, then copy them into the bf16 parameters."""
        _, grad_norm, _ = self.megatron.step()  # bf16 has no loss scaler, so megatron never skips the update
        return float(grad_norm)

    def state_dict(self) -> dict[str, Any]:
        """megatron's state: the inner AdamW's ``state_dict`` and the fp32 master parameters."""
        return self.megatron.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the AdamW state and the fp32 masters written by :meth:`state_dict`."""
        self.megatron.load_state_dict(state_dict)
        self._share_inner_groups()

    def sharded_state_dict(self, model_state: dict[str, Any], *, is_loading: bool) -> dict[str, Any]:
        """megatron's distributed-checkpoint form of the state (fp32 masters and moments sharded like the
        parameters of ``model_state``, the model's ``sharded_state_dict``); ``is_loading``: a template to load into."""
        return self.megatron.sharded_state_dict(model_state, is_loading=is_loading)

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`sharded_state_dict` saved, as loaded by ``dist_checkpointing``."""
        self.load_state_dict(state)

    def _share_inner_groups(self) -> None:
        """Alias the inner AdamW's ``param_groups`` and ``state`` (its ``load_state_dict`` replaces both objects),
        so a schedule setting ``lr`` here sets it where the step reads it."""
        self.param_groups = self.megatron.optimizer.param_groups
        self.state = self.megatron.optimizer.state
