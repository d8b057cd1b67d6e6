"""GRPOModule: the policy as a LightningModule with manual optimization — one training_step is one RL step.

training_step(step):
    begin: zero grads
    for chunk in step.chunks():          # whole prompt groups, streamed as the controller releases them
        forward, mask rows above grpo.seq_logprob_error_threshold, backward (raw sums), per micro-batch
    finish: normalise by the step's valid tokens, clip, one optimizer step, one scheduler step

The step's pieces are Lightning-free, in ``sc_lightning/trainer/`` (its docstring walks the whole RL step).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.config import SCConfig
from sc_lightning.engines.sampling import scoring_temperature
from sc_lightning.lightning.step_log import StepLog
from sc_lightning.trainer.bundle_policy import POLICY_SOURCE_KEY, policy_source_for
from sc_lightning.trainer.optim import adamw
from sc_lightning.trainer.perf import StepPerf, StepWork
from sc_lightning.trainer.policy_update import PolicyUpdate
from sc_lightning.trainer.sample_log import SAMPLES_DIR, SampleLog, read_sampled_prompts
from sc_lightning.trainer.step_stream import RLStep
from sc_lightning.trainer.step_totals import row_totals
from sc_lightning.trainer.train_data_log import FILENAME as TRAIN_DATA_FILENAME
from sc_lightning.trainer.train_data_log import TrainDataLog


class GRPOModule(LightningModule):
    """A megatron-core GPT policy trained by GRPO: manual optimization, one optimizer step per RL step."""

    def __init__(self, config: SCConfig) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.config = config
        self.policy: torch.nn.Module | None = None
        self.reference: torch.nn.Module | None = None
        self.spec: Any = None
        self.policy_source: Any = None  # a PolicySource: what the policy was built from, which checkpoints record
        self.tokenizer: Any = None
        self.loss_fn = ClippedPGLoss.from_config(config.loss_fn)
        self._train_data_log: TrainDataLog | None = None
        self._sample_log: SampleLog | None = None
        self._perf: StepPerf | None = None
        self._trained_lengths: list[int] = []  # the rows the policy ran this step (perf/*)
        self.step_work: StepWork | None = None  # the last step's tokens and logprob passes (GoodputMonitor's perf/*)
        self.step_log = StepLog()
        """The step's scalar metrics: the module's and the callbacks' (written once, after the step's callbacks)."""
        self.policy_trained = True
        """Whether the last training step changed the policy (the refit pushes weights only then); PPO's critic
        warm-up sets it False."""

    def configure_model(self) -> None:
        """Build (or import) the policy, and a frozen reference copy when the loss has a KL term."""
        if self.policy is not None:
            return
        from sc_lightning.models import load_policy
        from sc_lightning.models.warm_start import resolve_model_name

        policy_cfg, seed = self.config.policy, self.config.algo.seed
        layout = policy_cfg.megatron_cfg
        model_name = resolve_model_name(policy_cfg.model_name, seed=seed, device=self.model_device())

        def load() -> tuple[Any, Any, Any]:
            """The policy model, its spec and tokenizer."""
            return load_policy(
                model_name,
                precision=policy_cfg.precision,
                seed=seed,
                tp=layout.tensor_model_parallel_size,
                pp=layout.pipeline_model_parallel_size,
                sequence_parallel=layout.sequence_parallel,
                activation_checkpointing=layout.activation_checkpointing,
                tokenizer_name=policy_cfg.tokenizer_name,
                device=self.model_device(),
            )

        self.policy, self.spec, self.tokenizer = load()
        self.policy_source = policy_source_for(policy_cfg, model_name, self.spec)
        if self.loss_fn.reference_policy_kl_penalty > 0:
            self.reference = load()[0].requires_grad_(False).eval()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the policy's source in the checkpoint, so ``python -m sc_lightning export`` can rebuild it."""
        if self.policy_source is not None:
            checkpoint[POLICY_SOURCE_KEY] = self.policy_source.to_dict()

    def model_device(self) -> torch.device:
        """Where configure_model builds the models: the strategy's device (the CPU outside a Trainer)."""
        trainer = self._trainer
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    def configure_optimizers(self) -> Any:
        """AdamW with the configured warm-up and decay (stepped once per RL step by finish_train_step)."""
        policy = self.config.policy
        optimizer, scheduler = adamw(
            self.policy,
            policy.optimizer,
            self.config.algo.max_num_steps,
            distributed=policy.megatron_cfg.use_distributed_optimizer,
        )
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def policy_optimizer(self) -> Any:
        """The policy's (Lightning-wrapped) optimizer: each of its steps counts as one RL step."""
        return self.optimizers()

    def policy_scheduler(self) -> Any:
        """The policy's learning-rate scheduler."""
        return self.lr_schedulers()

    def checkpoint_parts(self, optimizers: list[Any]) -> dict[str, tuple[torch.nn.Module, Any]]:
        """The models a distributed checkpoint holds, by name, each with its optimizer from ``optimizers`` (the
        trainer's, in configure_optimizers' order; empty: models only)."""
        parts: dict[str, tuple[torch.nn.Module, Any]] = {"policy": (self.policy, optimizers[0] if optimizers else None)}
        if self.reference is not None:
            parts["reference"] = (self.reference, None)
        return parts

    def policy_update(self, *, optimizer: Any = None, step_scheduler: bool = True) -> PolicyUpdate:
        """The split train API over the policy's optimizer (or ``optimizer``), scheduler and backward."""
        return PolicyUpdate(
            self.policy,
            optimizer if optimizer is not None else self.policy_optimizer(),
            self.loss_fn,
            micro_batch_size=self.config.policy.train_micro_batch_size,
            micro_batch_tokens=self.config.policy.train_micro_batch_tokens,
            micro_batch_width_multiple=self.config.policy.train_micro_batch_width_multiple,
            trained_lengths=self._trained_lengths,
            clip_grad=self.config.policy.optimizer.clip_grad,
            backward=self.manual_backward,
            scheduler=self.policy_scheduler() if step_scheduler else None,
            vocab_size=self.spec.vocab_size,
            reference_model=self.reference,
            temperature=scoring_temperature(self.config.policy.generation.temperature),
            seq_logprob_error_threshold=self.config.algo.seq_logprob_error_threshold,
            seq_logprob_error_knob=f"{self.config.algo_name}.seq_logprob_error_threshold",
            max_token_staleness=self.config.loss_fn.max_token_staleness,
            frozen_pass=self.logprob_pass,
            teachers=distillation.aliases() if (distillation := self.config.on_policy_distillation) else (),
            full_vocabulary_coef=distillation.full_vocabulary_coef if distillation else 1.0,
        )

    def logprob_pass(self) -> AbstractContextManager[object]:
        """A context timing one frozen logprob pass into the step's perf (a no-op before training starts)."""
        return self._perf.logprob_pass() if self._perf is not None else contextlib.nullcontext()

    def on_train_start(self) -> None:
        """Open train_data.jsonl and samples/ (``data.*_log*``) on the leader, each rolled back to the resume step."""
        self._perf = StepPerf(self.policy, self.spec)
        root, data, leader = Path(self.trainer.default_root_dir), self.config.data, self.trainer.is_global_zero
        if data.train_data_log and leader:  # the leader writes every rank's rows
            self._train_data_log = TrainDataLog(root / TRAIN_DATA_FILENAME)
            self._train_data_log.open(resume_step=self.trainer.global_step)
        if data.sample_log_prompts and leader:
            self._sample_log = SampleLog(root / SAMPLES_DIR, every_n_steps=data.sample_log_every_n_steps)
            self._sample_log.open(resume_step=self.trainer.global_step)

    def log_filtered_groups(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        """Record in train_data.jsonl the groups dynamic sampling filtered for ``step`` (consumed, never trained)."""
        if self._train_data_log is not None and records:
            self._train_data_log.write_filtered(step, records)

    def on_train_end(self) -> None:
        """Close train_data.jsonl, and write the fit's last step into samples/."""
        if self._train_data_log is not None:
            self._train_data_log.close()
        if self._sample_log is not None:
            self._sample_log.close()

    def record_samples(self, step: RLStep, index: int) -> None:
        """On the leader, take step ``index``'s first ``data.sample_log_prompts`` prompt groups, decoded from the
        rows it trained (still in the data plane: the refit releases them), into the samples/ record."""
        if self._sample_log is not None:
            rows = self.trainer.strategy.rollout_side.data_plane
            groups = step.selected[: self.config.data.sample_log_prompts]
            self._sample_log.record(index, read_sampled_prompts(rows, groups, self.tokenizer, self.spec.vision))

    def train_dataloader(self) -> Any:
        """One item per RL step, from the Single-Controller strategy's rollout side; the version of each is the
        optimizer steps taken so far (``global_step``)."""
        trainer = self.trainer
        return trainer.strategy.rollout_side.rl_steps(version=lambda: trainer.global_step)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Open the step's perf measurement."""
        self._trained_lengths.clear()
        if self._perf is not None:
            self._perf.start()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Write the step's metrics (Lightning calls this after every callback's ``on_train_batch_end``)."""
        self.step_log.flush(self.trainer)

    def training_step(self, step: RLStep, batch_idx: int) -> dict[str, torch.Tensor]:
        """One RL step: accumulate every chunk of the step, then one optimizer step; logs train/* metrics."""
        started = time.monotonic()
        update = self.policy_update()
        index = self.trainer.global_step  # this step's number (the optimizer step below moves global_step on)
        update.begin(step=index, version=step.version)
        rewards, turns, staleness = [], [], []
        for chunk in step.chunks():
            update.train_chunk(chunk)
            rewards.append(chunk.rewards)
            turns.append(chunk.model_turns())
            staleness += [step.version - w for w in chunk.start_weights]
        metrics = update.finish()
        rewards_tensor = torch.cat(rewards) if rewards else torch.zeros(0)  # a rank may train no rows of a step
        turns_tensor = torch.cat(turns) if turns else torch.zeros(0)
        return self.finish_step(step, index, started, metrics, rewards_tensor, turns_tensor, staleness)

    def finish_step(
        self,
        step: RLStep,
        index: int,
        started: float,
        metrics: dict[str, float],
        rewards: torch.Tensor,
        model_turns: torch.Tensor,
        staleness: list[int],
    ) -> dict[str, torch.Tensor]:
        """Record the step (train_data.jsonl, samples/); log ``train/*``, ``perf/*``, timings and the progress bar.

        ``rewards``, ``model_turns`` and ``staleness`` are this rank's rows'; the logged values cover every
        data-parallel rank's.
        """
        if self._perf is not None:
            self._perf.synchronize()  # the clock below must cover the device's work
        if self.config.data.train_data_log:
            rows = self.trainer.strategy.rollout_side.trained_rows_on_leader(step.trained_rows)
            if self._train_data_log is not None:
                self._train_data_log.write(index, rows)
        timing = {
            "exposed_generation": step.first_wait_s + step.chunk_wait_s,
            "policy_training": time.monotonic() - started - step.chunk_wait_s,
        }
        self.step_log.log(self.trainer, {f"timing/train/{k}": v for k, v in timing.items()})
        self.record_samples(step, index)
        if self._perf is not None and self._trained_lengths:
            perf = self._perf.finish(self._trained_lengths, timing["policy_training"])
            self.step_log.log(self.trainer, {f"perf/{k}": v for k, v in perf.items()})
        read = row_totals(rewards, model_turns, staleness, sum(self._trained_lengths), self.model_device())
        rows = int(read.pop("rows"))
        self.step_work = StepWork(int(read.pop("tokens")), self._perf.logprob_s if self._perf is not None else 0.0)
        metrics |= read
        self.step_log.log(self.trainer, {f"train/{k}": v for k, v in metrics.items()})
        self.log("reward", metrics["reward"], prog_bar=True, logger=False, batch_size=rows)
        self.log("lag", metrics["staleness_max"], prog_bar=True, logger=False, batch_size=rows)
        return {name: torch.tensor(value) for name, value in metrics.items()}
