"""The tiny policy (and critic) trained at a parallel layout on this rank's share of each step, and the checks that a
multi-rank run equals one process's (tests/ranks.py starts the ranks)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.config.algorithm import GAEAdvantage, ValueLossConfig
from sc_lightning.config.model import OptimizerConfig
from sc_lightning.controller.api import GroupMeta
from sc_lightning.models import build_gpt_model, export_hf_weights
from sc_lightning.models.spec import ModelSpec
from sc_lightning.models.value import load_critic, values_from_output
from sc_lightning.trainer.chunks import TrainChunk, concat_chunks
from sc_lightning.trainer.critic_update import CriticUpdate, value_targets
from sc_lightning.trainer.data_parallel import (
    SummedGradients,
    data_parallel_rank,
    data_parallel_size,
    share_of_groups,
)
from sc_lightning.trainer.optim import adamw
from sc_lightning.trainer.pipeline import per_token_forward
from sc_lightning.trainer.policy_update import PolicyUpdate, frozen_logprobs
from tests.helpers.train_rows import SPEC, step_rows

STEPS, GENERATIONS = 3, 4
CHUNKS = (slice(0, 12), slice(12, 16))  # 3 groups, then 1: one rank trains nothing of the second chunk
KEYS = ("loss", "grad_norm", "global_valid_toks", "global_valid_seqs", "approx_entropy", "probs_ratio_max")


def group_metas(chunk: TrainChunk) -> list[GroupMeta]:
    """The chunk's groups as the controller would describe them (each group's rows are contiguous)."""
    lengths = chunk.token_mask.sum(1).int().tolist()
    ids = list(dict.fromkeys(chunk.group_ids))
    return [
        GroupMeta(gid, gid, tuple(str(i) for i in rows), tuple(lengths[i] for i in rows), 0, 0, None)
        for gid in ids
        for rows in [[i for i, g in enumerate(chunk.group_ids) if g == gid]]
    ]


def this_ranks_rows(chunk: TrainChunk) -> TrainChunk | None:
    """The rows of the chunk's groups that this data-parallel rank trains (None: no group)."""
    share = share_of_groups(group_metas(chunk), data_parallel_rank(), data_parallel_size())
    if not share:
        return None
    parts = [chunk.rows(slice(int(g.keys[0]), int(g.keys[-1]) + 1)) for g in share]
    return concat_chunks(parts, pad_token_id=0)


def new_policy(
    tensor_parallel_size: int = 1,
    seed: int = 0,
    pipeline_parallel_size: int = 1,
    sequence_parallel: bool = False,
    distributed_optimizer: bool = False,
    spec: ModelSpec = SPEC,
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The seeded tiny policy (or ``spec``) at this layout and its AdamW (over megatron DDP's buffer with several
    replicas or stages, or sequence parallelism; megatron's distributed optimizer with ``distributed_optimizer``)."""
    model = build_gpt_model(
        spec,
        precision="fp32",
        seed=seed,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        sequence_parallel=sequence_parallel,
    )
    return model, adamw(model, OptimizerConfig(lr=1e-3, clip_grad=0.05), STEPS, distributed=distributed_optimizer)[0]


def train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> list[dict[str, float]]:
    """GRPO steps ``steps`` (each two chunks), this rank training its share of each chunk; their metrics."""
    loss_fn = ClippedPGLoss(token_level_loss=True, reference_policy_kl_penalty=0.0)
    update = PolicyUpdate(model, optimizer, loss_fn, micro_batch_size=5, clip_grad=0.05)
    metrics = []
    for step in steps:
        rows = step_rows(10 + step, gens=GENERATIONS)
        update.begin(step=step)
        for part in CHUNKS:
            if (mine := this_ranks_rows(rows.rows(part))) is not None:
                update.train_chunk(mine)
        metrics.append(update.finish())
    return metrics


def full_weights(model: torch.nn.Module, spec: ModelSpec = SPEC) -> dict[str, torch.Tensor]:
    """The model's whole weights under HF names (gathered over tensor-parallel ranks)."""
    return {name: tensor.clone() for name, tensor in export_hf_weights(model, spec)}


def train_three_steps(
    tensor_parallel_size: int = 1,
    sequence_parallel: bool = False,
    distributed_optimizer: bool = False,
    spec: ModelSpec = SPEC,
) -> tuple[list[dict[str, float]], dict[str, torch.Tensor], bool, float]:
    """Three GRPO steps of the seeded tiny policy (or ``spec``; two chunks each), this rank training its share of
    each chunk; the metrics, the full weights, whether megatron's DDP summed the gradients, and the share of this
    rank's parameters whose AdamW moments this rank keeps."""
    model, optimizer = new_policy(
        tensor_parallel_size,
        sequence_parallel=sequence_parallel,
        distributed_optimizer=distributed_optimizer,
        spec=spec,
    )
    metrics = train_steps(model, optimizer, range(STEPS))
    moments = sum(state["exp_avg"].numel() for state in optimizer.state.values())
    kept = moments / sum(p.numel() for p in model.parameters())
    return metrics, full_weights(model, spec), isinstance(optimizer, SummedGradients), kept


def assert_matches_one_process(
    single: tuple[list[dict[str, float]], dict[str, torch.Tensor]], metrics: list, weights: dict, rank: int
) -> None:
    """A rank's metrics and weights equal one process's (metrics rel 1e-5; weights as for TP)."""
    for one, split in zip(single[0], metrics, strict=True):
        for key in KEYS:
            assert split[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), (rank, key)
    for name, tensor in single[1].items():
        # as for TP (tests/trainer/test_tensor_parallel.py): summation order noise through AdamW's m / sqrt(v)
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=2e-6, msg=f"rank {rank}: {name}")


def stage_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This pipeline stage's parameters under model-wide names (its layers renumbered by their global layer number;
    every parameter with one stage)."""
    weights = {}
    for name, param in model.named_parameters():
        parts = name.split(".")
        if parts[:2] == ["decoder", "layers"]:
            parts[2] = str(model.decoder.layers[int(parts[2])].layer_number - 1)  # layer_number counts from 1
        weights[".".join(parts)] = param.detach().clone()
    return weights


PPO_KEYS = (*KEYS, "kl_penalty", "critic/loss", "critic/grad_norm", "critic/explained_var", "critic/values_min")


def train_ppo_three_steps(
    pipeline_parallel_size: int = 1,
    tensor_parallel_size: int = 1,
    *,
    gathered: bool = False,
    distributed_optimizer: bool = False,
) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    """Three PPO steps (value stage with whitened GAE, two critic epochs, two policy epochs against a frozen pi_old,
    a KL term to a reference policy) on this rank's share of each step's groups; the critic's and policy's metrics,
    and both models' weights after: this pipeline stage's, or (``gathered``, for TP) the policy's whole weights and
    the critic's values on a probe, which every tensor-parallel rank holds whole. ``distributed_optimizer``: both
    models step megatron's distributed optimizer."""
    layout = {"pipeline_parallel_size": pipeline_parallel_size, "tensor_parallel_size": tensor_parallel_size}
    policy = build_gpt_model(SPEC, precision="fp32", seed=0, **layout)
    reference = build_gpt_model(SPEC, precision="fp32", seed=1, **layout).requires_grad_(False).eval()
    critic = load_critic("builtin:tiny", precision="fp32", seed=5, pp=pipeline_parallel_size, tp=tensor_parallel_size)
    opt_cfg = OptimizerConfig(lr=1e-3, clip_grad=0.05)
    policy_opt, _ = adamw(policy, opt_cfg, STEPS, distributed=distributed_optimizer)
    critic_opt, _ = adamw(critic, opt_cfg, STEPS, distributed=distributed_optimizer)
    critic_update = CriticUpdate(
        critic, critic_opt, ValueLossConfig(value_clip_epsilon=0.2), micro_batch_size=3, clip_grad=0.05
    )
    loss_fn = ClippedPGLoss(token_level_loss=True, reference_policy_kl_penalty=0.1)
    gae = GAEAdvantage(gae_lambda=0.95, gae_gamma=1.0, normalize_advantages=True)
    metrics = []
    for step in range(STEPS):
        mine = this_ranks_rows(step_rows(20 + step, gens=GENERATIONS))
        targets = value_targets(critic, mine, gae, micro_batch_size=3)
        critic_metrics = critic_update.train(mine, targets, epochs=2)
        batch = dataclasses.replace(mine, advantages=targets.advantages)
        prev = frozen_logprobs(policy, batch, micro_batch_size=5, vocab_size=SPEC.vocab_size, temperature=1.0)
        batch = dataclasses.replace(batch, prev_logprobs=prev)
        for _ in range(2):
            update = PolicyUpdate(
                policy, policy_opt, loss_fn, micro_batch_size=5, clip_grad=0.05, reference_model=reference
            )
            update.begin(step=step)
            update.train_chunk(batch)
            policy_metrics = update.finish()
        metrics.append({**{f"critic/{k}": v for k, v in critic_metrics.items()}, **policy_metrics})
    if gathered:
        probe = step_rows(0)
        values = per_token_forward(critic, probe, probe.plan(4), lambda _, output: values_from_output(output))
        return metrics, {**{f"policy.{k}": v for k, v in full_weights(policy).items()}, "critic.values": values}
    weights = {f"policy.{name}": tensor for name, tensor in stage_weights(policy).items()}
    weights.update({f"critic.{name}": tensor for name, tensor in stage_weights(critic).items()})
    return metrics, weights


def assert_ppo_matches_one_process(out: Path, world_size: int, *, gathered: bool = False) -> None:
    """Every rank's saved PPO metrics and weights (``ppo{rank}.pt``) equal one process's; together the ranks hold
    every weight."""
    single_metrics, single_weights = train_ppo_three_steps(gathered=gathered)
    assert all(m["kl_penalty"] > 0 for m in single_metrics), "the KL term must be live for the test to check it"
    covered: dict[str, torch.Tensor] = {}
    for rank in range(world_size):
        metrics, weights = torch.load(out / f"ppo{rank}.pt")
        for one, split in zip(single_metrics, metrics, strict=True):
            for key in PPO_KEYS:
                assert split[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (rank, key)
        for name, tensor in weights.items():
            torch.testing.assert_close(tensor, single_weights[name], rtol=1e-5, atol=2e-6, msg=f"rank {rank}: {name}")
        covered.update(weights)
    assert covered.keys() == single_weights.keys()
