"""On one GPU: the Triton SwiGLU and RoPE kernels agree with megatron's unfused path at any shape."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.models import build_gpt_model, builtin_spec, fused, token_logprobs

pytestmark = pytest.mark.gpu

SPEC = builtin_spec("builtin:small")


def test_fused_bf16_model_matches_unfused_at_every_shape() -> None:
    assert fused._triton_kernels() is not None  # GPU builds of torch ship Triton
    model = build_gpt_model(SPEC, precision="bf16", seed=0, device="cuda")
    plain = build_gpt_model(SPEC, precision="bf16", seed=0, device="cuda", fused_kernels=False)
    assert model.config.apply_rope_fusion and not plain.config.apply_rope_fusion  # the GPU default is fused
    g = torch.Generator().manual_seed(0)
    for rows, length in [(1, 1), (2, 17), (3, 40), (1, 96), (5, 64)]:
        ids = torch.randint(0, SPEC.vocab_size, (rows, length), generator=g)
        got, expected = token_logprobs(model, ids), token_logprobs(plain, ids)
        # bf16: the kernels round once where the unfused ops round after every op
        assert (got - expected).abs().max().item() < 0.1
        assert (got - expected).abs().mean().item() < 0.01
        got.sum().backward()
        expected.sum().backward()
    for (name, a), b in zip(plain.named_parameters(), model.parameters(), strict=True):
        rel = (a.grad.float() - b.grad.float()).norm() / a.grad.float().norm()
        assert rel.item() < 0.05, name
