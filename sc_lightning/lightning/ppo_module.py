"""PPOModule: the policy and a Megatron critic as one LightningModule — one training_step is one RL step.

training_step(step):
    batch    = the step's groups (PPO trains a step as one chunk)
    value stage, GAE, whitening                  (critic_update.value_targets)
    critic_ppo_epochs critic optimizer steps     (critic_update.CriticUpdate)
    if global_step >= ppo.policy_training_start_step:
        ppo_epochs policy optimizer steps on the GAE advantages, pi_old fixed at the step's start
    else (critic warm-up): the policy is not touched, and RefitCallback skips the weight push

Lightning counts RL steps by the policy optimizer's steps (``global_step``): the critic steps its raw optimizer,
the policy steps its raw optimizer for all but the last epoch, and during warm-up the policy optimizer steps with
no gradients at all (a no-op for AdamW: parameters without a gradient are skipped), so one RL step is always one
counted step. The policy's schedule advances once per trained step, the critic's once per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from sc_lightning.config import SCConfig
from sc_lightning.engines.sampling import scoring_temperature
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.trainer.chunks import TrainChunk, concat_chunks
from sc_lightning.trainer.critic_update import CriticUpdate, value_targets
from sc_lightning.trainer.optim import adamw, optimizer_state_to
from sc_lightning.trainer.policy_update import frozen_logprobs
from sc_lightning.trainer.sharded_checkpoint import SHARDED_KEY, load_sharded, saved_part_names
from sc_lightning.trainer.step_stream import RLStep


class PPOModule(GRPOModule):
    """A megatron-core GPT policy and critic trained by PPO with GAE; critic warm-up and warm start."""

    def __init__(self, config: SCConfig) -> None:
        if config.ppo is None or config.value is None or config.value_loss_fn is None:
            raise ValueError("PPOModule needs a config with ppo:, value: and value_loss_fn: blocks")
        super().__init__(config)
        self.critic: torch.nn.Module | None = None

    def configure_model(self) -> None:
        """The policy (and reference) as for GRPO, plus the critic on ``value.model_name``'s backbone.

        A critic whose vocabulary cannot embed every id of the policy's tokenizer is a TokenizerMismatchError.
        """
        super().configure_model()
        if self.critic is not None:
            return
        from sc_lightning.models.policy_source import model_spec
        from sc_lightning.models.value import load_critic
        from sc_lightning.models.warm_start import resolve_model_name
        from sc_lightning.tokenizer import check_tokenizer_fits_model

        value, seed = self.config.value, self.config.algo.seed
        name = resolve_model_name(value.model_name, seed=seed, device=self.model_device())
        check_tokenizer_fits_model(  # the critic reads the policy's token ids; checked before it is built
            self.tokenizer,
            model_spec(name).vocab_size,
            model_name=value.model_name,
            tokenizer_name=self.config.policy.tokenizer_name,
            model_knob="value.model_name",
        )
        self.critic = load_critic(
            name,
            precision=value.precision,
            seed=seed,
            tp=value.megatron_cfg.tensor_model_parallel_size,
            pp=value.megatron_cfg.pipeline_model_parallel_size,
            sequence_parallel=value.megatron_cfg.sequence_parallel,
            activation_checkpointing=value.megatron_cfg.activation_checkpointing,
            device=self.model_device(),
        )

    def configure_optimizers(self) -> Any:
        """Policy and critic AdamW, each with its schedule (the policy's spans its trained steps only)."""
        ppo = self.config.ppo
        trained_steps = max(1, ppo.max_num_steps - ppo.policy_training_start_step)
        policy, value = self.config.policy, self.config.value
        policy_opt, policy_sched = adamw(
            self.policy,
            policy.optimizer,
            trained_steps,
            distributed=policy.megatron_cfg.use_distributed_optimizer,
        )
        critic_opt, critic_sched = adamw(
            self.critic, value.optimizer, ppo.max_num_steps, distributed=value.megatron_cfg.use_distributed_optimizer
        )
        return [policy_opt, critic_opt], [policy_sched, critic_sched]

    def checkpoint_parts(self, optimizers: list[Any]) -> dict[str, tuple[torch.nn.Module, Any]]:
        """The policy's parts (see GRPOModule) and the critic with its optimizer (the second)."""
        parts = super().checkpoint_parts(optimizers)
        parts["critic"] = (self.critic, optimizers[1] if optimizers else None)
        return parts

    def policy_optimizer(self) -> Any:
        """The policy's optimizer (the first): its steps count RL steps."""
        return self.optimizers()[0]

    def policy_scheduler(self) -> Any:
        """The policy's learning-rate scheduler (the first)."""
        return self.lr_schedulers()[0]

    def on_fit_start(self) -> None:
        """A fresh run with ``ppo.warm_start_value_checkpoint`` seeds the critic (and its optimizer) from it."""
        source = self.config.ppo.warm_start_value_checkpoint
        if source is not None and self.trainer.ckpt_path is None:
            load_critic_checkpoint(self, Path(source))

    def training_step(self, step: RLStep, batch_idx: int) -> dict[str, torch.Tensor]:
        """One RL step: value stage and GAE, critic epochs, then policy epochs (unless in critic warm-up)."""
        started = time.monotonic()
        index = self.trainer.global_step
        chunks = list(step.chunks())
        batch = concat_chunks(chunks, pad_token_id=self.tokenizer.pad_token_id)
        staleness = [step.version - w for w in batch.start_weights]
        with self._policy_optimizer_offloaded():
            targets = value_targets(
                self.critic,
                batch,
                self.config.ppo.adv_estimator,
                micro_batch_size=self.config.value.train_micro_batch_size,
            )
            critic_metrics = self._critic_update().train(batch, targets, self.config.ppo.critic_epochs())
        self.lr_schedulers()[1].step()
        batch = dataclasses.replace(batch, advantages=targets.advantages)
        self.policy_trained = index >= self.config.ppo.policy_training_start_step
        if self.policy_trained:
            metrics = self._train_policy(batch, index, step.version)
        else:
            metrics = self._count_untrained_step()
        metrics["policy_trained"] = float(self.policy_trained)
        self.step_log.log(self.trainer, {f"critic/{k}": v for k, v in critic_metrics.items()})
        return self.finish_step(step, index, started, metrics, batch.rewards, batch.model_turns(), staleness)

    @contextlib.contextmanager
    def _policy_optimizer_offloaded(self) -> Iterator[None]:
        """``policy.offload_optimizer_for_logprob``: the policy's AdamW state waits on the CPU while the critic runs.

        A no-op on a CPU run (the state is there already); on an accelerator it frees the policy's moments for the
        critic's activations and brings them back, unchanged, before the policy trains.
        """
        if not self.config.policy.offload_optimizer_for_logprob:
            yield
            return
        optimizer = self.policy_optimizer().optimizer
        home = next(self.policy.parameters()).device
        optimizer_state_to(optimizer, torch.device("cpu"))
        try:
            yield
        finally:
            optimizer_state_to(optimizer, home)

    def _critic_update(self) -> CriticUpdate:
        return CriticUpdate(
            self.critic,
            self.optimizers()[1].optimizer,  # raw: the critic's steps are not RL steps
            self.config.value_loss_fn,
            micro_batch_size=self.config.value.train_micro_batch_size,
            clip_grad=self.config.value.optimizer.clip_grad,
            backward=self.manual_backward,
        )

    def _train_policy(self, batch: TrainChunk, index: int, version: int) -> dict[str, float]:
        """``ppo_epochs`` optimizer steps over the batch at trainer weight ``version``; the last one is Lightning's
        counted step.

        The step reports the last epoch's metrics. ``loss_fn.max_token_staleness`` masks old tokens out of the policy
        loss only: the critic regresses on every token (a value target does not depend on which weights sampled the
        token, and GAE needs every position's value). The sequence logprob-error mask depends only on pi_old and
        pi_gen, both fixed over the step, so every epoch masks the same rows and its metrics are counted once.
        """
        epochs = self.config.ppo.ppo_epochs
        if epochs > 1:  # later epochs must measure their ratio against the policy the step started with
            with self.logprob_pass():
                prev_logprobs = frozen_logprobs(
                    self.policy,
                    batch,
                    micro_batch_size=self.config.policy.train_micro_batch_size,
                    micro_batch_tokens=self.config.policy.train_micro_batch_tokens,
                    micro_batch_width_multiple=self.config.policy.train_micro_batch_width_multiple,
                    vocab_size=self.spec.vocab_size,
                    temperature=scoring_temperature(self.config.policy.generation.temperature),
                )
            batch = dataclasses.replace(batch, prev_logprobs=prev_logprobs)
        metrics: dict[str, float] = {}
        for epoch in range(epochs):
            last = epoch == epochs - 1
            optimizer = self.policy_optimizer() if last else self.policy_optimizer().optimizer
            update = self.policy_update(optimizer=optimizer, step_scheduler=last)
            update.begin(step=index, version=version)
            update.train_chunk(batch)
            metrics = update.finish()
        return metrics

    def _count_untrained_step(self) -> dict[str, float]:
        """Critic warm-up: step the policy optimizer without gradients (no parameter moves), so the step counts."""
        optimizer = self.policy_optimizer()
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        return {"lr": 0.0}


def load_critic_checkpoint(module: PPOModule, source: Path) -> None:
    """Seed ``module``'s critic (weights, and AdamW state when present) from a bundle or ``trainer.ckpt`` file;
    a bundle with a distributed checkpoint (several ranks, or megatron's distributed optimizer) is resharded to this
    run's layout (a collective: every rank calls this)."""
    path = source / "trainer.ckpt" if source.is_dir() else source
    where = "ppo.warm_start_value_checkpoint"
    if not path.is_file():
        raise FileNotFoundError(
            f"{where}={source}: no checkpoint at {path} (give a bundle step_N/ or its trainer.ckpt)"
        )
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if SHARDED_KEY in checkpoint:
        _load_sharded_critic(module, path.parent / checkpoint[SHARDED_KEY]["directory"], checkpoint[SHARDED_KEY])
        return
    state = {k.removeprefix("critic."): v for k, v in checkpoint["state_dict"].items() if k.startswith("critic.")}
    if not state:
        raise ValueError(f"{where}={source}: {path} holds no critic (was it written by a PPO run?)")
    result = module.critic.load_state_dict(state, strict=False)
    missing = [key for key in result.missing_keys if not key.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{where}={source}: the critic does not fit value.model_name's architecture (missing {missing[:4]}, "
            f"unexpected {result.unexpected_keys[:4]})"
        )
    optimizer_states = checkpoint.get("optimizer_states") or []
    if len(optimizer_states) > 1:
        module.optimizers()[1].optimizer.load_state_dict(optimizer_states[1])


def _load_sharded_critic(module: PPOModule, directory: Path, saved: dict[str, Any]) -> None:
    """Load the critic (and its optimizer, when the bundle holds optimizers) from a bundle's distributed checkpoint."""
    if "critic" not in saved_part_names(directory):
        raise ValueError(f"ppo.warm_start_value_checkpoint: {directory} holds no critic (was it written by a PPO run?)")
    optimizer = module.optimizers()[1].optimizer if saved["optimizers"] else None
    load_sharded(directory, {"critic": (module.critic, optimizer)})
