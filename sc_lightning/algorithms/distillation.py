"""On-policy distillation (OPD): a teacher's judgement of the tokens the student sampled, as an advantage or a loss.

Shapes as in :mod:`.advantages`: ``(B, T)`` per token, aligned with ``input_ids`` (position ``t`` holds the quantity
for token ``t`` given tokens ``< t``); full-vocabulary tensors add a trailing ``V`` (the real vocabulary).

Sampled-token variant (reverse KL through the sampled token): each model token's advantage is the stop-gradient gap
``log pi_teacher(y_t) - log pi_gen(y_t)`` between the teacher and the policy that sampled it (the engine's logprob),
so the clipped policy gradient with its importance weight ``pi_old / pi_gen`` follows ``-KL(pi_theta || pi_teacher)``
for any staleness of the sample, as GRPO's rewards do. Environment and prompt tokens get 0 (the mask). An optional
``reward_weight`` adds the GRPO reward advantage on top (a mix of distillation and RL).

Full-vocabulary variant: the exact reverse KL at every model position,
``KL_t = sum_v pi_s(v) (log pi_s(v) - log pi_t(v))``, differentiable in the student, added to the loss.

References: on-policy distillation (Agarwal et al. 2024, "On-Policy Distillation of Language Models",
arXiv:2306.13649; Thinking Machines, "On-Policy Distillation", 2025); MiMo multi-teacher OPD (Xiaomi 2025).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["full_vocabulary_reverse_kl", "opd_advantages", "teacher_kl_sums"]


def opd_advantages(
    teacher_logprobs: Tensor,
    generation_logprobs: Tensor,
    token_mask: Tensor,
    *,
    reward_advantages: Tensor | None = None,
    reward_weight: float = 0.0,
) -> Tensor:
    """Per-token distillation advantages ``(teacher - gen) + reward_weight * reward_adv`` on model tokens: (B, T).

    Args:
        teacher_logprobs: (B, T) log pi_teacher of each sampled token (0 off the model's tokens).
        generation_logprobs: (B, T) log pi_gen, the sampler's logprob of each token.
        token_mask: (B, T) 1 on the model's tokens (prompt, environment and padding tokens: 0).
        reward_advantages: (B, T) GRPO advantages (0 off the mask); needed when ``reward_weight`` > 0.
        reward_weight: weight of ``reward_advantages`` in the sum.

    Returns:
        (B, T) detached advantages, 0 outside the mask, in the dtype of ``generation_logprobs`` promoted to fp32.
    """
    valid = token_mask.bool()
    dtype = torch.promote_types(generation_logprobs.dtype, torch.float32)
    gap = teacher_logprobs.detach().to(dtype) - generation_logprobs.detach().to(dtype)
    if reward_weight:
        if reward_advantages is None:
            raise ValueError("reward_weight > 0 needs the reward advantages to mix in")
        gap = gap + reward_weight * reward_advantages.detach().to(dtype)
    return torch.where(valid, gap, torch.zeros((), dtype=dtype, device=gap.device))


def full_vocabulary_reverse_kl(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Exact reverse KL per position, ``sum_v p_s(v) (log p_s(v) - log p_t(v))``: (B, T, V) x2 and (B, T) -> (B, T).

    ``student_logprobs`` carries the gradient; the teacher's is detached. Positions outside ``mask`` are 0 (their
    teacher rows are not read, so padding there may hold anything finite).
    """
    teacher = teacher_logprobs.detach().to(student_logprobs.dtype)
    kl = (student_logprobs.exp() * (student_logprobs - teacher)).sum(-1)  # (B, T)
    return torch.where(mask.bool(), kl, torch.zeros((), dtype=kl.dtype, device=kl.device))


def teacher_kl_sums(
    teacher_logprobs: Tensor, generation_logprobs: Tensor, mask: Tensor, teacher_ids: Tensor, num_teachers: int
) -> tuple[Tensor, Tensor]:
    """Per teacher: the sum over its rows' masked tokens of ``log pi_gen - log pi_teacher`` (a one-sample estimate
    of KL(student || teacher) per token) and the number of those tokens; two (num_teachers,) tensors.

    ``teacher_ids`` (B,) long names each row's teacher (its index in ``on_policy_distillation.aliases()``; -1:
    none, not counted).
    """
    dtype = torch.promote_types(generation_logprobs.dtype, torch.float32)
    valid = mask.to(dtype)
    per_row_kl = ((generation_logprobs.to(dtype) - teacher_logprobs.to(dtype)) * valid).sum(-1)  # (B,)
    per_row_tokens = valid.sum(-1)  # (B,)
    routed = teacher_ids >= 0
    index = teacher_ids.clamp(min=0).to(per_row_kl.device)
    kl = torch.zeros(num_teachers, dtype=dtype, device=per_row_kl.device)
    tokens = torch.zeros(num_teachers, dtype=dtype, device=per_row_kl.device)
    kl.index_add_(0, index, torch.where(routed, per_row_kl, 0.0))
    tokens.index_add_(0, index, torch.where(routed, per_row_tokens, 0.0))
    return kl, tokens
