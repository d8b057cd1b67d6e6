"""The CPU compatibility layer (RoPE, RNG tracker) and the SDPA core attention used on CPU and GPU."""

from __future__ import annotations

import math

import pytest
import torch

from sc_lightning.models.attention import SDPACoreAttention, gpt_layer_spec_sdpa
from sc_lightning.models.cpu_compat import CPURNGStatesTracker, apply_cpu_compat

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:full scope is deprecated"),
]


def test_apply_is_idempotent_and_installs_the_patches() -> None:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.tensor_parallel import random as mc_random

    apply_cpu_compat()
    get_emb, tracker = RotaryEmbedding.get_emb, mc_random.get_cuda_rng_tracker()
    apply_cpu_compat()
    assert RotaryEmbedding.get_emb is get_emb and mc_random.get_cuda_rng_tracker() is tracker
    assert isinstance(tracker, CPURNGStatesTracker)
    rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, use_cpu_initialization=True)
    emb = rope(6)
    assert emb.shape == (6, 1, 1, 8) and emb.device.type == "cpu"
    assert torch.allclose(emb[3, 0, 0, :4], 3 * rope.inv_freq) and torch.equal(emb[..., :4], emb[..., 4:])


def test_rng_tracker_forks_a_separate_reproducible_stream() -> None:
    tracker = CPURNGStatesTracker()
    tracker.add("a", 123)
    torch.manual_seed(0)
    outer_before = torch.get_rng_state()
    with tracker.fork("a"):
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outer_before)  # the outer stream did not move
    with tracker.fork("a"):
        second = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(torch.cat([first, second]), torch.rand(6))  # one continuous stream seeded with 123
    with pytest.raises(KeyError, match="not tracked"):
        tracker.fork("b").__enter__()
    with pytest.raises(ValueError, match="already tracked"):
        tracker.add("c", 123)


def _attention(heads: int = 4, groups: int = 2) -> SDPACoreAttention:
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=64,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=16,
        attention_dropout=0.0,
    )
    return SDPACoreAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Plain attention: q [sq,b,h,d], k/v [sk,b,g,d], ``masked`` [sq,sk] True = hidden; returns [sq,b,h*d]."""
    rep = q.size(2) // k.size(2)
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("qbhd,kbhd->bhqk", q, k) / math.sqrt(q.size(-1))
    probs = scores.masked_fill(masked, float("-inf")).softmax(-1)
    out = torch.einsum("bhqk,kbhd->qbhd", probs, v)
    return out.reshape(q.size(0), q.size(1), -1)


@pytest.mark.parametrize(("sq", "sk"), [(7, 7), (3, 7), (1, 7)])
def test_sdpa_matches_plain_causal_gqa_attention(sq: int, sk: int) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, 2, h, 16, generator=gen) for s, h in ((sq, 4), (sk, 2), (sk, 2)))
    causal = torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq)  # query i sits at position sk - sq + i
    got = _attention()(q, k, v, None)
    assert got.shape == (sq, 2, 64)
    assert torch.allclose(got, _reference(q, k, v, ~causal), atol=1e-5)


def test_sdpa_uses_an_explicit_megatron_mask_as_given() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(5, 1, 4, 16, generator=gen) for _ in range(3))
    hidden = torch.zeros(1, 1, 5, 5, dtype=torch.bool)
    hidden[..., 1] = True  # nobody may look at key 1; no causal mask is added on top
    hidden[0, 0, 1, 0] = True  # keep every row with at least one visible key
    got = _attention(heads=4, groups=4)(q, k, v, hidden)
    assert torch.allclose(got, _reference(q, k, v, hidden[0, 0]), atol=1e-5)


def test_layer_spec_swaps_only_the_core_attention() -> None:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    ours, stock = gpt_layer_spec_sdpa(), get_gpt_layer_local_spec(normalization="RMSNorm")
    assert ours.submodules.self_attention.submodules.core_attention is SDPACoreAttention
    assert stock.submodules.self_attention.submodules.core_attention is not SDPACoreAttention
    assert ours.submodules.mlp == stock.submodules.mlp


def test_sdpa_attention_dropout_uses_the_model_parallel_rng_stream() -> None:
    from megatron.core.tensor_parallel import random as mc_random

    attention = _attention()
    attention.dropout_p = 0.5
    q, k, v = (torch.randn(6, 1, h, 16) for h in (4, 2, 2))
    tracker = mc_random.get_cuda_rng_tracker()
    saved = tracker.get_states()
    outer = torch.get_rng_state()
    first = attention(q, k, v, None)
    assert torch.equal(torch.get_rng_state(), outer)  # dropout drew from the tracker's stream, not the global one
    tracker.set_states(dict(saved))
    assert torch.equal(attention(q, k, v, None), first)
    attention.eval()
    assert not torch.equal(attention(q, k, v, None), first)
