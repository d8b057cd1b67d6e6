"""The PPO critic's side of a step: value stage, GAE targets, and ``critic_ppo_epochs`` optimizer steps.

    values  = V_old(s_t)                       critic forward, no gradient (the value stage)
    rewards = terminal reward at the last valid token of each row
    A, R    = GAE(rewards, values; gamma, lambda) with carry-forward masking; R = A + V_old
    A       = whiten(A) over the step's valid tokens            (ppo.adv_estimator.normalize_advantages)
    for each critic epoch: one optimizer step on
        coef * 0.5 * max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2), averaged over valid tokens

Micro-batches backpropagate raw sums; the gradient is divided once by the step's valid-token count, so the update
does not depend on the micro-batch size. With several data-parallel ranks each holds a share of the step's rows;
the count, the whitening statistics and the metrics cover every rank's rows. ``critic/explained_var`` =
1 - Var(R - V) / Var(R) over valid tokens, with V from the last epoch's forward. With pipeline stages the forwards
and the loss run through megatron's schedule (:mod:`~sc_lightning.trainer.pipeline`): values, GAE targets and the
loss exist on the last stage, and its metrics reach every stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from megatron.core import parallel_state
from torch import Tensor

from sc_lightning.algorithms import (
    clipped_value_loss,
    gae_advantages,
    loss_mask,
    terminal_token_rewards,
    valid_counts,
    whiten,
)
from sc_lightning.config.algorithm import GAEAdvantage, ValueLossConfig
from sc_lightning.models.value import values_from_output
from sc_lightning.trainer.chunks import TrainChunk
from sc_lightning.trainer.data_parallel import Reduce, data_parallel_group, sum_over_data_parallel
from sc_lightning.trainer.microbatch import MicroBatchPlan
from sc_lightning.trainer.pipeline import (
    from_last_stage,
    microbatch_shape,
    per_token_forward,
    pipeline_parallel_size,
    train_microbatches,
)
from sc_lightning.trainer.policy_update import normalised_step
from sc_lightning.trainer.step_totals import StepTotals

_SUMS = ("loss", "vf_clipfrac", "values_mean", "returns_mean")
_REDUCTIONS = {**dict.fromkeys(_SUMS, "sum"), "values_min": "min", "values_max": "max"}


@dataclass
class ValueTargets:
    """The value stage's output for a step's batch: (B, T) tensors."""

    old_values: Tensor
    advantages: Tensor
    returns: Tensor
    mask: Tensor


def value_targets(
    critic: torch.nn.Module,
    batch: TrainChunk,
    estimator: GAEAdvantage,
    *,
    micro_batch_size: int,
    micro_batch_tokens: int | None = None,
) -> ValueTargets:
    """Critic forward by micro-batch (no gradient), terminal rewards, GAE and optional whitening for ``batch`` (with
    several data-parallel ranks, whitened over every rank's share of the step).

    Values are read where a loss term can use them (a row's positions up to its last valid token), 0 elsewhere;
    with pipeline stages only the last stage reads them, and the targets of the other stages are never used.
    """
    mask = loss_mask(batch.token_mask, batch.sample_mask)  # (B, T)
    plans = batch.plan(micro_batch_size, micro_batch_tokens)
    old_values = per_token_forward(critic, batch, plans, lambda _, output: values_from_output(output))
    token_rewards = terminal_token_rewards(batch.rewards, mask)
    advantages, returns = gae_advantages(
        token_rewards, old_values, mask, gamma=estimator.gae_gamma, lam=estimator.gae_lambda
    )
    if estimator.normalize_advantages:
        advantages = whiten(advantages, mask, reduce=sum_over_data_parallel)
    return ValueTargets(old_values, advantages, returns, mask)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor, *, reduce: Reduce | None = None) -> float:
    """1 - Var(R - V) / Var(R) over the valid entries (0 when the returns do not vary); ``reduce`` sums over the
    data-parallel ranks that hold the rest of the step."""
    reduce = reduce or (lambda total: total)
    valid = mask.bool()
    r, d = returns[valid].double(), (returns - values)[valid].double()
    n, r_sum, d_sum = reduce(torch.stack([r.new_tensor(float(r.numel())), r.sum(), d.sum()]))
    if n < 2:
        return 0.0
    r_var, d_var = reduce(torch.stack([(r - r_sum / n).square().sum(), (d - d_sum / n).square().sum()]))
    return 0.0 if float(r_var) == 0.0 else float(1.0 - d_var / r_var)


class CriticUpdate:
    """``critic_ppo_epochs`` optimizer steps of the clipped value loss over one step's batch."""

    def __init__(
        self,
        critic: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss: ValueLossConfig,
        *,
        micro_batch_size: int,
        clip_grad: float,
        backward: Callable[[Tensor], None] | None = None,
    ) -> None:
        self.critic, self.optimizer, self.loss = critic, optimizer, loss
        self.micro_batch_size, self.clip_grad = micro_batch_size, clip_grad
        self.backward = backward or (lambda value: value.backward())

    def train(self, batch: TrainChunk, targets: ValueTargets, epochs: int) -> dict[str, float]:
        """Run ``epochs`` optimizer steps; returns the last epoch's ``critic/*`` metrics (without the prefix)."""
        tokens = float(sum_over_data_parallel(valid_counts(targets.mask)[0].double()))
        if tokens == 0:
            raise ValueError("the step has no valid token: the critic has nothing to fit")
        metrics: dict[str, float] = {}
        for _ in range(epochs):
            metrics = self._epoch(batch, targets, tokens)
        return metrics

    def _epoch(self, batch: TrainChunk, targets: ValueTargets, tokens: float) -> dict[str, float]:
        self.critic.train()
        self.optimizer.zero_grad(set_to_none=True)
        group = data_parallel_group()
        device = targets.mask.device
        totals = StepTotals(_REDUCTIONS, process_group=group, sync=group is not None).to(device)
        values = torch.zeros_like(targets.returns)  # this epoch's, for explained variance (on the last stage)
        plans = batch.plan(self.micro_batch_size)

        def loss_of(plan: MicroBatchPlan, output: Tensor) -> Tensor:
            """The clipped value loss of one micro-batch (a raw sum), its metrics folded into ``totals``."""
            rows, width = torch.tensor(plan.rows, device=device), plan.width
            predicted = values_from_output(output)
            mask = targets.mask[rows, :width]
            loss, parts = clipped_value_loss(
                predicted,
                targets.old_values[rows, :width],
                targets.returns[rows, :width],
                mask,
                clip_epsilon=self.loss.value_clip_epsilon,
                coef=self.loss.value_loss_coef,
                num_valid_tokens=1.0,  # raw sums; normalised once below
            )
            valid = predicted.detach()[mask.bool()]
            totals.update({name: parts[name] for name in _SUMS})
            if valid.numel():
                totals.update({"values_min": valid.min(), "values_max": valid.max()})
            values[rows, :width] = predicted.detach().to(values.dtype)
            return loss

        train_microbatches(
            self.critic,
            ((batch.input_ids[plan.rows, : plan.width], plan) for plan in plans),
            loss_of,
            count=len(plans),
            shape=microbatch_shape(plans),
            backward=self.backward,
        )
        if pipeline_parallel_size() > 1:
            totals.fold_over(parallel_state.get_pipeline_model_parallel_group())
        grad_norm, lr = normalised_step(self.critic, self.optimizer, tokens, self.clip_grad)
        read = totals.compute()
        metrics = {name: read.get(name, 0.0) / tokens for name in _SUMS}
        explained = explained_variance(values, targets.returns, targets.mask, reduce=sum_over_data_parallel)
        metrics.update(
            values_min=read["values_min"],
            values_max=read["values_max"],
            explained_var=from_last_stage(explained, device),
            grad_norm=grad_norm,
            lr=lr,
        )
        return metrics
