"""Per-token staleness: the ``max_token_staleness`` mask drops exactly the old tokens from the policy loss, and the
staleness metrics, against values written by hand."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.algorithms import (
    ClippedPGLoss,
    loss_mask,
    token_staleness_mask,
    token_staleness_metrics,
    valid_counts,
)

TRAINER_VERSION = 5
# 3 rows x 6 tokens, prompt in columns 0-1 (-1), completions sampled across refits:
# row 0 spans a refit mid-request (versions 2, 2, then 4, 4); row 1 is all fresh (5); row 2 all old (1) but short.
VERSIONS = torch.tensor(
    [
        [-1, -1, 2, 2, 4, 4],
        [-1, -1, 5, 5, 5, 5],
        [-1, -1, 1, 1, -1, -1],
    ]
)
TOKEN_MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]], dtype=torch.float32)
OLD = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]], dtype=torch.bool)  # staleness > 2


def loss_inputs() -> dict[str, torch.Tensor]:
    """Seeded logprobs and advantages with distinct values on every token, so no masked token can hide."""
    g = torch.Generator().manual_seed(0)
    return {
        "logprobs": (-torch.rand(3, 6, generator=g) - 0.1).requires_grad_(),
        "generation_logprobs": -torch.rand(3, 6, generator=g) - 0.1,
        "advantages": torch.randn(3, 1, generator=g).expand(3, 6) * TOKEN_MASK,
    }


@pytest.mark.parametrize("token_level", [True, False])
def test_max_token_staleness_masks_exactly_the_old_tokens(token_level: bool) -> None:
    loss_fn = ClippedPGLoss(reference_policy_kl_penalty=0.0, token_level_loss=token_level)
    base = loss_mask(TOKEN_MASK, torch.ones(3))
    staleness_mask = token_staleness_mask(VERSIONS, TRAINER_VERSION, 2)
    assert torch.equal(staleness_mask.bool() | ~TOKEN_MASK.bool(), ~OLD)  # on completions: kept iff fresh

    def run(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = loss_inputs()
        tokens, seqs = valid_counts(mask)
        loss, _ = loss_fn(
            inputs["logprobs"],
            prev_logprobs=inputs["logprobs"].detach(),
            generation_logprobs=inputs["generation_logprobs"],
            advantages=inputs["advantages"],
            mask=mask,
            num_valid_tokens=tokens,
            num_valid_seqs=seqs,
        )
        loss.backward()
        return loss.detach(), inputs["logprobs"].grad

    masked_loss, grad = run(base * staleness_mask)
    by_hand = base.clone()
    by_hand[OLD] = 0.0  # the loss over the fresh tokens only, written out
    fresh_loss, fresh_grad = run(by_hand)
    assert masked_loss == pytest.approx(fresh_loss.item(), rel=1e-6)
    assert torch.equal(grad[OLD], torch.zeros(int(OLD.sum())))  # no gradient reaches an old token
    fresh = base.bool() & ~OLD
    assert (grad[fresh] != 0).all()  # every fresh token still learns
    torch.testing.assert_close(grad, fresh_grad)
    unmasked_loss, _ = run(base)
    assert masked_loss != pytest.approx(unmasked_loss.item())  # the old tokens did weigh in before


def test_staleness_metrics_cover_the_loss_tokens_only() -> None:
    mask = loss_mask(TOKEN_MASK, torch.tensor([1.0, 1.0, 0.0]))  # row 2 flagged by the environment
    metrics = token_staleness_metrics(VERSIONS, TRAINER_VERSION, mask)
    assert metrics["token_staleness_mean"].item() == 3 + 3 + 1 + 1 + 0 * 4  # a raw sum; the step divides
    assert metrics["token_staleness_max"].item() == 3
    none = token_staleness_metrics(VERSIONS, TRAINER_VERSION, torch.zeros(3, 6))
    assert none["token_staleness_mean"].item() == 0 and none["token_staleness_max"].item() == -float("inf")


def test_without_a_bound_every_token_is_kept() -> None:
    assert torch.equal(token_staleness_mask(VERSIONS, TRAINER_VERSION, None), torch.ones(3, 6))
    assert torch.equal(token_staleness_mask(VERSIONS, TRAINER_VERSION, 0)[1, 2:], torch.ones(4))  # staleness 0 kept
