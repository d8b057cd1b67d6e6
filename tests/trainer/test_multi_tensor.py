"""The foreach multi-tensor kernels compute what megatron's Python-loop fallbacks compute, and replace only those."""

from __future__ import annotations

import torch
from megatron.core import utils as megatron_utils
from megatron.core.optimizer import clip_grads
from megatron.core.optimizer import optimizer as megatron_optimizer

from sc_lightning.trainer.multi_tensor import foreach_l2norm, foreach_scale, install_foreach_multi_tensor


def tensors(seed: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """A few tensors of different shapes."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype) for shape in [(7,), (3, 5), (2, 2, 4)]]


def test_the_norm_and_the_scaled_copies_equal_megatrons_loops() -> None:
    grads = tensors(0)
    ours, _ = foreach_l2norm(0, None, [grads], False)
    # megatron's loop returns a CUDA tensor (no CUDA here): its value is the norm of all elements together
    assert ours.shape == (1,) and torch.allclose(ours, torch.cat([g.flatten() for g in grads]).norm())
    masters = tensors(1)
    low, expected = tensors(2, torch.bfloat16), tensors(2, torch.bfloat16)
    foreach_scale(0, None, [masters, low], 1.0)  # fp32 masters cast into bf16 parameters
    megatron_utils.local_multi_tensor_scale(0, None, [masters, expected], 1.0)
    assert all(torch.equal(a, b) for a, b in zip(low, expected, strict=True))
    scaled, expected = tensors(3), tensors(3)
    foreach_scale(0, None, [scaled, scaled], 0.25)  # in place: megatron's gradient clipping
    megatron_utils.local_multi_tensor_scale(0, None, [expected, expected], 0.25)
    assert all(torch.equal(a, b) for a, b in zip(scaled, expected, strict=True))
    out = tensors(4)
    foreach_scale(0, None, [tensors(5), out], 3.0)
    assert all(torch.equal(a, b * 3.0) for a, b in zip(out, tensors(5), strict=True))


def test_install_replaces_megatrons_fallbacks(monkeypatch) -> None:
    monkeypatch.setattr(clip_grads, "l2_norm_impl", megatron_utils.local_multi_tensor_l2_norm)
    monkeypatch.setattr(clip_grads, "multi_tensor_scale_impl", megatron_utils.local_multi_tensor_scale)
    monkeypatch.setattr(megatron_optimizer, "multi_tensor_scale_impl", megatron_utils.local_multi_tensor_scale)
    install_foreach_multi_tensor()
    assert clip_grads.l2_norm_impl is foreach_l2norm
    assert clip_grads.multi_tensor_scale_impl is foreach_scale
    assert megatron_optimizer.multi_tensor_scale_impl is foreach_scale


def test_install_keeps_a_fused_kernel_that_is_no_fallback(monkeypatch) -> None:
    """Apex's or Transformer Engine's fused kernels, where megatron found them, stay: only the fallbacks go."""

    def fused(*args: object) -> None:
        """Stands in for a fused kernel."""

    monkeypatch.setattr(clip_grads, "l2_norm_impl", fused)
    monkeypatch.setattr(clip_grads, "multi_tensor_scale_impl", fused)
    monkeypatch.setattr(megatron_optimizer, "multi_tensor_scale_impl", fused)
    install_foreach_multi_tensor()
    assert clip_grads.l2_norm_impl is fused
    assert clip_grads.multi_tensor_scale_impl is fused
    assert megatron_optimizer.multi_tensor_scale_impl is fused
