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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_target_logprobs_match_megatrons_cross_entropy(dtype: torch.dtype) -> None:
    from megatron.core import tensor_parallel

    g = torch.Generator(device="cuda").manual_seed(0)
    vocab, real, temperature = 32_128, 32_000, 0.7  # TP padding columns past the real vocabulary
    logits = (torch.randn(3 * 50, vocab, generator=g, device="cuda") * 4).to(dtype)
    targets = torch.randint(0, real, (3 * 50,), generator=g, device="cuda")
    upstream = torch.randn(3 * 50, generator=g, device="cuda")
    fused_in = logits.clone().requires_grad_()
    got = fused.target_logprobs(fused_in, targets, real, temperature)
    (got * upstream).sum().backward()
    reference_in = logits.float().clone().requires_grad_()
    masked = (reference_in / temperature).masked_fill(torch.arange(vocab, device="cuda") >= real, float("-inf"))
    expected = -tensor_parallel.vocab_parallel_cross_entropy(masked[None], targets[None])[0]
    (expected * upstream).sum().backward()
    assert got.dtype == torch.float32 and fused_in.grad.dtype == dtype
    assert (got - expected).abs().max().item() < 1e-3
    assert (fused_in.grad.float() - reference_in.grad).abs().max().item() < (1e-5 if dtype == torch.float32 else 2e-2)
    assert fused_in.grad[:, real:].abs().max().item() == 0  # padding columns get no gradient
