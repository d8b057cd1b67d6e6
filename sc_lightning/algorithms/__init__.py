"""RL math as pure torch functions: advantage estimators (GRPO, GAE) and the policy/value losses.

Imports only torch. Shape legend and the chunking contract are documented in :mod:`.advantages` and :mod:`.losses`.
"""

from sc_lightning.algorithms.advantages import (
    expand_to_tokens,
    gae_advantages,
    grpo_advantages,
    grpo_advantages_by_group,
    terminal_token_rewards,
    whiten,
)
from sc_lightning.algorithms.losses import (
    METRIC_REDUCTIONS,
    ClippedPGLoss,
    clipped_value_loss,
    kl_estimate,
    loss_mask,
    valid_counts,
)

__all__ = [
    "METRIC_REDUCTIONS",
    "ClippedPGLoss",
    "clipped_value_loss",
    "expand_to_tokens",
    "gae_advantages",
    "grpo_advantages",
    "grpo_advantages_by_group",
    "kl_estimate",
    "loss_mask",
    "terminal_token_rewards",
    "valid_counts",
    "whiten",
]
