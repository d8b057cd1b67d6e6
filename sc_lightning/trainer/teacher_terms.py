"""The train step's on-policy distillation terms: per-teacher metrics, and the full-vocabulary reverse-KL loss term.

Per micro-batch, over the tokens the loss counts, for each teacher alias ``a`` (``on_policy_distillation.aliases()``):
``teacher_kl/a`` (mean over its tokens of ``log pi_gen - log pi_teacher``, a one-sample estimate of
KL(student || teacher)), ``teacher_reward/a`` (mean reward of its rows) and ``teacher_rows/a`` (its rows in the step:
the routing count). With full-vocabulary distillation, ``full_vocabulary_kl``: the exact reverse KL per token, whose
raw sum (times ``full_vocabulary_coef``) joins the loss and is normalised with it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import parallel_state

from sc_lightning.algorithms import full_vocabulary_reverse_kl, teacher_kl_sums
from sc_lightning.trainer.chunks import TrainChunk

FULL_VOCABULARY_KL = "full_vocabulary_kl"


def teacher_reductions(aliases: tuple[str, ...]) -> dict[str, str]:
    """How each distillation metric of a step with these teachers combines over micro-batches and ranks (all sums)."""
    names = [f"{kind}/{alias}" for alias in aliases for kind in ("teacher_kl", "teacher_tokens", "teacher_reward")]
    names += [f"teacher_rows/{alias}" for alias in aliases]
    return dict.fromkeys([*names, FULL_VOCABULARY_KL] if aliases else [], "sum")


def teacher_metrics(batch: TrainChunk, mask: torch.Tensor, aliases: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The micro-batch's per-teacher sums over ``mask`` (the loss's tokens); empty without teacher fields."""
    if batch.teacher_ids is None or batch.teacher_logprobs is None or not aliases:
        return {}
    ids = batch.teacher_ids.to(mask.device)
    kl, tokens = teacher_kl_sums(batch.teacher_logprobs, batch.generation_logprobs, mask, ids, len(aliases))
    rewards = torch.zeros(len(aliases), dtype=kl.dtype, device=kl.device)
    rows = torch.zeros(len(aliases), dtype=kl.dtype, device=kl.device)
    rewards.index_add_(0, ids, batch.rewards.to(device=kl.device, dtype=kl.dtype))
    rows.index_add_(0, ids, torch.ones_like(rows[ids]))
    out = {}
    for i, alias in enumerate(aliases):
        out |= {f"teacher_kl/{alias}": kl[i], f"teacher_tokens/{alias}": tokens[i]}
        out |= {f"teacher_reward/{alias}": rewards[i], f"teacher_rows/{alias}": rows[i]}
    return out


def teacher_denominator(name: str, read: dict[str, float]) -> float | None:
    """What a distillation metric's step sum is divided by (None: ``name`` is no distillation metric)."""
    kind, _, alias = name.partition("/")
    if kind == "teacher_kl":
        return read[f"teacher_tokens/{alias}"]
    if kind == "teacher_reward":
        return read[f"teacher_rows/{alias}"]
    if kind == "teacher_rows":
        return 1.0
    if name == FULL_VOCABULARY_KL:
        return read["tokens"]
    return None


def student_vocab_logprobs(logits: torch.Tensor, vocab_size: int, temperature: float) -> torch.Tensor:
    """(B, T, V) log-softmax of the policy's logits over the real vocabulary, aligned as the teacher's (position t:
    the distribution of token t; position 0 is 0). Needs the whole vocabulary on this rank (tensor parallel size 1)."""
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        raise ValueError(
            "on_policy_distillation.full_vocabulary needs policy.megatron_cfg.tensor_model_parallel_size: 1 (the "
            "policy's logits are split over the vocabulary); use full_vocabulary: false or tensor parallel size 1"
        )
    logprobs = torch.log_softmax(logits[..., :vocab_size].float() / temperature, -1)  # logits[t] predicts t + 1
    return F.pad(logprobs[:, :-1], (0, 0, 1, 0))


def full_vocabulary_term(
    batch: TrainChunk, student: torch.Tensor, mask: torch.Tensor, coef: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss term ``coef * sum over mask of KL_t`` (raw sum: the step normalises it with the loss) and its metric."""
    assert batch.teacher_vocab_logprobs is not None
    teacher = batch.teacher_vocab_logprobs.to(student.device)
    kl = full_vocabulary_reverse_kl(student, teacher, mask).sum()
    return coef * kl, {FULL_VOCABULARY_KL: kl.detach()}
