"""Advantage estimators: GRPO's group-relative baseline and PPO's generalised advantage estimation (GAE).

Pure torch functions, no state. Shape legend used in every docstring and comment:

    G  prompt groups          N  generations per group (the group size)
    B  rows (sequences)       T  tokens per row (padded), aligned with ``input_ids``

A per-token tensor ``x[b, t]`` belongs to token ``t`` of row ``b``. For logprobs and values this means position
``t`` holds the quantity for *predicting* token ``t`` from tokens ``< t``, so column 0 is never a training token.

References: GRPO, Shao et al. 2024 (arXiv:2402.03300) with the leave-one-out baseline of RLOO (Ahmadian et al.
2024, arXiv:2402.14740); GAE, Schulman et al. 2015 (arXiv:1506.02438).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

__all__ = [
    "expand_to_tokens",
    "gae_advantages",
    "grpo_advantages",
    "grpo_advantages_by_group",
    "terminal_token_rewards",
    "whiten",
]


def grpo_advantages(
    rewards: Tensor, *, leave_one_out: bool = True, normalize: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages ``A = (r - baseline) / std`` for rewards laid out as (groups, generations).

    Args:
        rewards: (G, N) one scalar reward per completion; row g holds the N completions of prompt g.
        leave_one_out: baseline of sample i is the mean of the *other* N - 1 rewards of its group, and its std
            the Bessel-corrected std of those others; otherwise the group mean and the group's Bessel-corrected
            std (factor N / (N - 1)).
        normalize: divide by ``std + eps`` where ``std > 0``; where ``std == 0`` the raw difference is kept.
        eps: added to the std before dividing.

    Returns:
        (G, N) advantages, same dtype as ``rewards``. A group whose rewards are all equal (including a group of
        one) gets exactly 0. A std is exactly 0 when the values it is computed from are all equal, so rounding
        never produces a tiny spurious std that would blow a difference up by 1 / eps.
    """
    r = rewards.double()  # (G, N); float64 so baselines of equal rewards cancel cleanly
    n = r.shape[-1]
    if n < 2:
        return torch.zeros_like(rewards)
    if leave_one_out:
        baseline, std = _leave_one_out_stats(r)
    else:
        baseline = r.mean(-1, keepdim=True).expand_as(r)  # (G, N)
        std = r.std(-1, correction=1, keepdim=True).expand_as(r)  # sqrt(sum (r - mean)^2 / (N - 1))
    adv = r - baseline
    if normalize:
        adv = torch.where(std > 0, adv / (std + eps), adv)
    constant_group = (r.amax(-1) == r.amin(-1)).unsqueeze(-1)  # (G, 1)
    return adv.masked_fill(constant_group, 0.0).to(rewards.dtype)


def _leave_one_out_stats(r: Tensor) -> tuple[Tensor, Tensor]:
    """Per sample: mean and Bessel-corrected std of the other N - 1 rewards of its group; (G, N) -> two (G, N)."""
    g, n = r.shape
    m = n - 1  # size of the "others" set
    others = ~torch.eye(n, dtype=torch.bool, device=r.device)  # (N_i, N_j): j is an "other" of i
    r_ij = r.unsqueeze(1).expand(g, n, n)  # (G, N_i, N_j) = r[g, j]
    baseline = torch.where(others, r_ij, 0.0).sum(-1) / m  # mean_{j != i} r_j
    if m < 2:  # one other sample: its std is undefined -> 0 (no normalisation)
        return baseline, torch.zeros_like(baseline)
    dev = torch.where(others, r_ij - baseline.unsqueeze(-1), 0.0)  # r_j - mean_{-i}
    std = (dev.square().sum(-1) / (m - 1)).sqrt()  # sqrt(sum_{j != i} dev^2 / (m - 1))
    hi = torch.where(others, r_ij, -torch.inf).amax(-1)
    lo = torch.where(others, r_ij, torch.inf).amin(-1)
    return baseline, std.masked_fill(hi == lo, 0.0)


def grpo_advantages_by_group(
    rewards: Tensor,
    group_ids: Sequence[Hashable],
    *,
    leave_one_out: bool = True,
    normalize: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO advantages for flat rows tagged with their group: (B,) rewards and B group ids -> (B,) advantages.

    Rows of a group need not be contiguous and groups may differ in size; each group is computed exactly as
    :func:`grpo_advantages` computes one row of a (G, N) layout.
    """
    if len(group_ids) != rewards.shape[0]:
        raise ValueError(f"{len(group_ids)} group ids for {rewards.shape[0]} rewards")
    members: dict[Hashable, list[int]] = {}
    for row, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(row)
    out = torch.zeros_like(rewards)
    for rows in members.values():
        index = torch.tensor(rows, device=rewards.device)
        group = rewards[index].unsqueeze(0)  # (1, n)
        adv = grpo_advantages(group, leave_one_out=leave_one_out, normalize=normalize, eps=eps)
        out[index] = adv.squeeze(0)
    return out


def expand_to_tokens(adv_per_sequence: Tensor, mask: Tensor) -> Tensor:
    """Broadcast one advantage per sequence to its tokens: (B,) and (B, T) mask -> (B, T), 0 outside the mask."""
    per_token = adv_per_sequence.unsqueeze(-1).expand(mask.shape)  # (B, T)
    return torch.where(mask.bool(), per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))


def terminal_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's reward on its last valid token: (B,) and (B, T) mask -> (B, T) token rewards.

    Rows without a valid token get no reward. This is PPO's sparse reward: ``token_rewards[b, last_b] = r_b``.
    """
    valid = mask.bool()  # (B, T)
    t = valid.shape[-1]
    positions = torch.arange(t, device=valid.device).expand_as(valid)  # (B, T)
    last = torch.where(valid, positions, -1).amax(-1)  # (B,) index of the last valid token, -1 if none
    out = torch.zeros(valid.shape, dtype=rewards.dtype, device=rewards.device)
    has = last >= 0
    out[has.nonzero(as_tuple=True)[0], last[has]] = rewards[has]
    return out


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation with carry-forward masking: (B, T) x3 -> (advantages, returns), (B, T).

    Backward recursion over the valid tokens of each row (``mask == 1``)::

        delta_t = r_t + gamma * V_next - V_t
        A_t     = delta_t + gamma * lam * A_next
        R_t     = A_t + V_t

    where ``V_next`` / ``A_next`` belong to the next *valid* token of the row (0 after the last one). Masked
    positions (prompt, padding, or tool output inside a completion) are skipped: they carry the running
    ``V_next`` and ``A_next`` through unchanged, so a gap inside a completion neither discounts nor bootstraps.
    ``values[b, t]`` is the critic's estimate for the state before token ``t`` (the same alignment as logprobs).
    Advantages and returns are 0 outside the mask.
    """
    valid = mask.bool()  # (B, T)
    dtype = torch.promote_types(values.dtype, torch.float32)
    r, v = token_rewards.to(dtype), values.to(dtype)
    next_value = torch.zeros_like(v[:, 0])  # (B,)
    running = torch.zeros_like(v[:, 0])  # (B,) A of the next valid token
    advantages = torch.zeros_like(v)  # (B, T)
    for t in reversed(range(v.shape[-1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        gae = delta + gamma * lam * running
        here = valid[:, t]
        running = torch.where(here, gae, running)  # carry forward through masked positions
        next_value = torch.where(here, v[:, t], next_value)
        advantages[:, t] = torch.where(here, gae, 0.0)
    returns = torch.where(valid, advantages + v, 0.0)
    return advantages.to(values.dtype), returns.to(values.dtype)


def whiten(x: Tensor, mask: Tensor, *, eps: float = 1e-8, reduce: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """Normalise ``x`` to zero mean and unit variance over the masked entries: (B, T) -> (B, T), 0 outside.

    ``(x - mean) / sqrt(var + eps)`` with the masked mean and Bessel-corrected masked variance
    (``sum (x - mean)^2 / (n - 1)``; ``n - 1`` floored at 1). Statistics cover exactly what is passed in, so
    pass the whole step's advantages to whiten over the step; ``reduce`` (a sum over the processes that hold the
    rest of the step, e.g. data-parallel ranks) extends them to entries held elsewhere.
    """
    reduce = reduce or (lambda total: total)
    valid = mask.bool()
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    n, total = reduce(torch.stack([valid.sum().to(xf.dtype), torch.where(valid, xf, 0.0).sum()]))
    mean = total / n.clamp(min=1)
    var = reduce(torch.where(valid, (xf - mean).square(), 0.0).sum()) / (n - 1).clamp(min=1)
    return torch.where(valid, (xf - mean) * torch.rsqrt(var + eps), 0.0).to(x.dtype)
