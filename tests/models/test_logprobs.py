"""token_logprobs: equals a log_softmax/gather of transformers' logits, 0 at position 0, right-padding invariant."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sc_lightning.models.logprobs import logits_of, logprobs_from_logits, token_logprobs
from tests.helpers.models import hf_causal_lm, random_ids

pytestmark = pytest.mark.usefixtures("model_parallel")


def _reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(ids[t] | ids[<t]) from full logits (B, T, V), with 0 at t = 0."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)[:, :-1]
    picked = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


@pytest.fixture(scope="module")
def qwen(tiny_dirs: dict[str, Path]) -> tuple[torch.nn.Module, torch.nn.Module]:
    from sc_lightning.models.megatron import load_policy

    model, _, _ = load_policy(str(tiny_dirs["qwen2"]), precision="fp32")
    return model.eval(), hf_causal_lm(tiny_dirs["qwen2"])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_transformers(qwen: tuple, temperature: float) -> None:
    model, hf = qwen
    ids = random_ids(4, 40, seed=2)
    with torch.no_grad():
        expected = _reference(hf(ids).logits, ids, temperature)
        got = token_logprobs(model, ids, temperature=temperature)
    assert got.dtype == torch.float32 and got.shape == (4, 40)
    assert torch.equal(got[:, 0], torch.zeros(4))
    assert (got - expected).abs().max().item() < 1e-4
    assert (got[:, 1:] < 0).all()


def test_right_padding_does_not_change_real_tokens(qwen: tuple) -> None:
    model, _ = qwen
    ids = random_ids(3, 20, seed=4)
    padded = torch.cat([ids, random_ids(3, 13, seed=5)], dim=1)  # junk after the real tokens
    with torch.no_grad():
        short, long = token_logprobs(model, ids), token_logprobs(model, padded)
    # equal up to fp32 rounding (another sequence length changes the matmul blocking: a few ulps, ~1e-6 here); a
    # padding token leaking into attention would move the logprobs by orders of magnitude more
    assert torch.allclose(long[:, :20], short, rtol=1e-6, atol=1e-6)
    one = token_logprobs(model, ids[1:2])  # batch composition does not matter either
    assert torch.allclose(one, short[1:2], rtol=1e-6, atol=1e-6)


def test_gradient_matches_a_plain_log_softmax(qwen: tuple) -> None:
    model, _ = qwen
    ids = random_ids(2, 16, seed=6)
    weights = torch.randn(2, 16, generator=torch.Generator().manual_seed(7))
    param = model.decoder.final_layernorm.weight

    model.zero_grad()
    (token_logprobs(model, ids) * weights).sum().backward()
    ours = param.grad.clone()
    model.zero_grad()
    (_reference(model(ids, None, None), ids) * weights).sum().backward()
    assert torch.allclose(ours, param.grad, rtol=1e-5, atol=1e-6)
    model.zero_grad()


def test_vocab_beyond_the_real_size_is_masked(qwen: tuple) -> None:
    model, _ = qwen
    ids = random_ids(2, 12, seed=8, vocab=15)
    with torch.no_grad():
        logits = model(ids, None, None)
        got = token_logprobs(model, ids, vocab_size=15)
        expected = _reference(logits[..., :15], ids)
        assert torch.allclose(got, expected, rtol=0, atol=1e-6)
        assert logits_of(model, ids, vocab_size=15).shape == (2, 12, 15)


def test_logprobs_from_logits_is_exact_on_known_numbers() -> None:
    # two ids, uniform logits: every log-prob is log(1/2)
    logits = torch.zeros(1, 3, 2)
    ids = torch.tensor([[1, 0, 1]])
    got = logprobs_from_logits(logits, ids)
    assert torch.allclose(got, torch.tensor([[0.0, -0.6931472, -0.6931472]]))
