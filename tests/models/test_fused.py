"""Fused SwiGLU and RoPE (models/fused.py): the same math as megatron's unfused path, wired through its hooks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings import rope_utils

from sc_lightning.models import build_gpt_model, builtin_spec, fused, token_logprobs

SPEC = builtin_spec("builtin:tiny")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_functions_compute_megatrons_unfused_math(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, 2 * 24, generator=g).to(dtype)
    gate, up = torch.chunk(x, 2, dim=-1)
    assert torch.equal(fused.swiglu(x), F.silu(gate) * up)
    t = torch.randn(7, 2, 4, 16, generator=g).to(dtype)
    freqs = torch.randn(7, 1, 1, 16, generator=g)
    assert torch.equal(fused.fused_rope(t, freqs), rope_utils._apply_rotary_pos_emb_bshd(t, freqs))
    partial = torch.randn(7, 1, 1, 8, generator=g)  # rotary_percent < 1: the rest of the head passes through
    assert torch.equal(fused.fused_rope(t, partial), rope_utils._apply_rotary_pos_emb_bshd(t, partial))
    with pytest.raises(NotImplementedError, match="interleaved"):
        fused.fused_rope(t, freqs, interleaved=True)


def test_a_fused_model_uses_both_kernels_and_matches_the_unfused_model(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"rope": 0, "swiglu": 0}

    def counted(name: str, fn):
        def wrapper(*args):
            calls[name] += 1
            return fn(*args)

        return wrapper

    monkeypatch.setattr(fused, "rope", counted("rope", fused.rope))
    monkeypatch.setattr(fused, "swiglu", counted("swiglu", fused.swiglu))
    plain = build_gpt_model(SPEC, seed=3)
    assert not plain.config.apply_rope_fusion  # on the CPU the default is megatron's unfused path
    ids = torch.randint(0, SPEC.vocab_size, (3, 17), generator=torch.Generator().manual_seed(1))
    expected = token_logprobs(plain, ids)
    assert calls == {"rope": 0, "swiglu": 0}
    model = build_gpt_model(SPEC, seed=3, fused_kernels=True)
    got = token_logprobs(model, ids)
    layers = SPEC.num_layers
    assert calls == {"rope": 2 * layers, "swiglu": layers}  # query and key per layer; one MLP per layer
    assert torch.equal(got, expected)
    expected.sum().backward()
    got.sum().backward()
    for (name, a), b in zip(plain.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name


def test_fused_target_logprobs_are_gpu_only() -> None:
    logits = torch.randn(4, 10)
    assert fused.target_logprobs(logits, torch.zeros(4, dtype=torch.long), 10) is None  # CPU: megatron's path
