"""The decode step's sampler: sample_tokens' conventions, noise streams independent of the batch."""

from __future__ import annotations

import torch

from sc_lightning.engines.megatron.decode_sampling import NoiseStream, sample_next
from sc_lightning.types import SamplingParams


def stream(seed: int, vocab: int = 50) -> NoiseStream:
    """A noise stream over ``vocab`` tokens from a generator seeded with ``seed``."""
    return NoiseStream(torch.Generator().manual_seed(seed), vocab)


def test_greedy_rows_take_the_argmax_and_logprobs_follow_the_convention() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(4, temperature=0.0), SamplingParams(4, temperature=0.5, top_k=1), SamplingParams(4)]
    tokens, logprobs = sample_next(logits, params, [None, None, stream(1)])
    assert tokens[:2].tolist() == logits[:2].argmax(-1).tolist()
    scale = torch.tensor([1.0, 0.5, 1.0])[:, None]  # greedy: T = 1; top_k == 1 keeps its temperature
    expected = (logits / scale).log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
    assert torch.allclose(logprobs, expected)


def test_a_row_samples_the_same_tokens_whatever_shares_its_batch() -> None:
    gen = torch.Generator().manual_seed(1)
    steps = [torch.randn(4, 50, generator=gen) for _ in range(70)]  # past one noise block (64 rows at vocab 50)
    settings = SamplingParams(70, temperature=0.9, top_p=0.9, seed=3)
    alone_stream, batched_stream = stream(3), stream(3)
    others = [stream(10 + i) for i in range(3)]
    other_settings = [SamplingParams(70, temperature=1.3), SamplingParams(70, temperature=0.0), SamplingParams(70)]
    for logits in steps:
        alone, _ = sample_next(logits[:1], [settings], [alone_stream])
        batched, _ = sample_next(logits, [settings, *other_settings], [batched_stream, others[0], None, others[2]])
        assert alone.item() == batched[0].item()


def test_top_k_and_top_p_rows_never_leave_their_set_and_draws_follow_the_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -9.0]]).repeat(4000, 1)
    params = [SamplingParams(1, top_k=2)] * 2000 + [SamplingParams(1, top_p=0.7)] * 2000
    noise = [stream(i, vocab=5) for i in range(4000)]
    tokens, _ = sample_next(logits, params, noise)
    assert set(tokens[:2000].tolist()) == {0, 1} and set(tokens[2000:].tolist()) <= {0, 1}
    share = (tokens[:2000] == 0).float().mean().item()  # p(0 | top-2) = e / (e + 1) = 0.731
    assert abs(share - 0.731) < 0.04, share
