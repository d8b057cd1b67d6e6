"""RL math as pure torch functions: advantages (GRPO, GAE), policy/value losses, sequence logprob error.

Imports only torch. Shape legend and the chunking contract are documented in :mod:`.advantages` and :mod:`.losses`;
the sequence-level logprob-error screen (per-row error, threshold mask) in :mod:`.seq_logprob_error`; per-token
staleness (metrics, the ``max_token_staleness`` mask) in :mod:`.token_staleness`; on-policy distillation's
advantages and full-vocabulary reverse KL in :mod:`.distillation`.
"""

from sc_lightning.algorithms.advantages import (
    expand_to_tokens,
    gae_advantages,
    grpo_advantages,
    grpo_advantages_by_group,
    terminal_token_rewards,
    whiten,
)
from sc_lightning.algorithms.distillation import full_vocabulary_reverse_kl, opd_advantages, teacher_kl_sums
from sc_lightning.algorithms.losses import (
    METRIC_REDUCTIONS,
    ClippedPGLoss,
    clipped_value_loss,
    kl_estimate,
    loss_mask,
    valid_counts,
)
from sc_lightning.algorithms.seq_logprob_error import (
    seq_logprob_error_mask,
    seq_logprob_error_metrics,
    seq_mult_prob_error,
)
from sc_lightning.algorithms.token_staleness import (
    TOKEN_STALENESS_REDUCTIONS,
    token_staleness_mask,
    token_staleness_metrics,
)

__all__ = [
    "METRIC_REDUCTIONS",
    "TOKEN_STALENESS_REDUCTIONS",
    "ClippedPGLoss",
    "clipped_value_loss",
    "expand_to_tokens",
    "full_vocabulary_reverse_kl",
    "gae_advantages",
    "grpo_advantages",
    "grpo_advantages_by_group",
    "kl_estimate",
    "loss_mask",
    "opd_advantages",
    "seq_logprob_error_mask",
    "seq_logprob_error_metrics",
    "seq_mult_prob_error",
    "teacher_kl_sums",
    "terminal_token_rewards",
    "token_staleness_mask",
    "token_staleness_metrics",
    "valid_counts",
    "whiten",
]
