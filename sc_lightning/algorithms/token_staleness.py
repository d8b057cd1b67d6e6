"""Per-token staleness: how many refits old the weights that sampled each token are, and the mask that drops the
oldest tokens from the policy loss.

Shape legend as in :mod:`.losses`: ``B`` rows, ``T`` tokens per row, aligned with ``input_ids``. For token ``t``
of row ``b``, sampled by weight version ``v[b, t]`` (``Generation.token_versions``; a completion that spans an
in-flight refit holds two or more versions), and a trainer at version ``V``::

    staleness[b, t] = V - v[b, t]
    kept[b, t]      = staleness[b, t] <= max_token_staleness         # only with the knob set

``loss_fn.max_token_staleness`` clears the mask of every token above the bound *before* the step's valid tokens and
sequences are counted, so the loss normalises over the kept tokens only (token-level: sum over kept tokens / kept
tokens of the step; sequence-level: each row's mean over its kept tokens / rows with a kept token) — exactly as if
the old tokens had never been sampled, as the sequence logprob-error mask does for whole rows. The old tokens stay
in the sequence: later tokens are still scored given them.

Chunking contract: :func:`token_staleness_metrics` returns a raw sum (the step divides by its valid tokens) and a
max, combined over micro-batches as :data:`TOKEN_STALENESS_REDUCTIONS` says.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["TOKEN_STALENESS_REDUCTIONS", "token_staleness_mask", "token_staleness_metrics"]

TOKEN_STALENESS_REDUCTIONS = {
    "token_staleness_mean": "sum",  # raw sum over the loss's valid tokens of V - v; the step divides by its tokens
    "token_staleness_max": "max",  # max over the loss's valid tokens (-inf for a micro-batch without one)
}
"""How each metric of :func:`token_staleness_metrics` combines over the micro-batches of one step."""


def token_staleness_mask(token_versions: Tensor, trainer_version: int, max_staleness: int | None) -> Tensor:
    """1.0 where a token is at most ``max_staleness`` versions behind ``trainer_version``, else 0.0: (B, T) float32
    (all ones when ``max_staleness`` is None)."""
    if max_staleness is None:
        return torch.ones(token_versions.shape, dtype=torch.float32, device=token_versions.device)
    return (trainer_version - token_versions <= max_staleness).float()


def token_staleness_metrics(token_versions: Tensor, trainer_version: int, mask: Tensor) -> dict[str, Tensor]:
    """The raw staleness sum and the max over the valid tokens of ``mask`` (B, T), column 0 excluded as the losses
    exclude it."""
    valid = mask.bool().clone()
    valid[:, 0] = False
    staleness = (trainer_version - token_versions).double()
    return {
        "token_staleness_mean": torch.where(valid, staleness, 0.0).sum(),
        "token_staleness_max": torch.where(valid, staleness, -torch.inf).max(),
    }
