"""One RL step = one optimizer step, streamed over chunks: ``begin`` → ``train_chunk`` × k → ``finish``.

Chunks arrive while the step is assembled, before the step's valid-token count is known. So every micro-batch
backpropagates the loss as a raw sum (normaliser 1) and gradients accumulate; ``finish`` divides the gradients
(and the summed metrics) once by the step's global count, clips, and steps the optimizer. The result does not
depend on how the step was chunked or micro-batched: grad_norm and the new weights are the same for 1 chunk or 4.

A vision-language policy (:mod:`sc_lightning.models.vlm`) is fed each row's images with its tokens
(``TrainChunk.pixel_values``), here and in every frozen pass (pi_old, the reference policy); its ``<image>`` tokens
are prompt tokens, outside the loss (``token_mask`` 0: a chunk that says otherwise is a ValueError).

On GRPO the policy does not change inside a step, so the trainer's old logprobs equal the current ones: prev =
logprobs.detach() (ratio 1 with a gradient), and the importance weight exp(prev − gen) corrects for the engine.
PPO with several epochs over one batch sets the chunk's ``prev_logprobs`` (pi_old, fixed at the step's start).

Each micro-batch, between the forward and the loss, measures every row's sequence logprob error (mean over its
valid tokens of exp|gen − prev|, see :mod:`sc_lightning.algorithms.seq_logprob_error`). With
``seq_logprob_error_threshold`` set, rows above it leave the loss: their mask is zeroed before the step's valid
tokens and sequences are counted, so the normaliser counts only the kept rows. Without it, only the metrics.

A step opened with the trainer's weight version (``begin(version=...)``) measures each trained token's staleness
(that version minus the one that sampled the token, :mod:`sc_lightning.algorithms.token_staleness`):
``token_staleness_mean|max`` over the tokens the loss counts. With ``max_token_staleness`` set, tokens older than
that leave the loss first, the same way (before the counts), so the step normalises over the fresh tokens only.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial

import torch
from megatron.core import parallel_state

from sc_lightning.algorithms import (
    METRIC_REDUCTIONS,
    TOKEN_STALENESS_REDUCTIONS,
    ClippedPGLoss,
    loss_mask,
    seq_logprob_error_mask,
    seq_logprob_error_metrics,
    seq_mult_prob_error,
    token_staleness_mask,
    token_staleness_metrics,
    valid_counts,
)
from sc_lightning.models.logprobs import logprobs_from_logits, real_vocab_size
from sc_lightning.models.vlm import check_images_out_of_loss, vision_of
from sc_lightning.trainer.chunks import TrainChunk
from sc_lightning.trainer.data_parallel import data_parallel_group
from sc_lightning.trainer.grad_clip import clip_model_parallel_grads
from sc_lightning.trainer.pipeline import (
    microbatch_shape,
    model_input,
    per_token_forward,
    pipeline_parallel_size,
    train_microbatches,
)
from sc_lightning.trainer.step_totals import StepTotals
from sc_lightning.trainer.teacher_terms import (
    full_vocabulary_term,
    student_vocab_logprobs,
    teacher_denominator,
    teacher_metrics,
    teacher_reductions,
)


class EmptyStepError(RuntimeError):
    """Every completion of a step was filtered out, so there is nothing to train on."""


COUNTS = ("tokens", "seqs", "checked_seqs")
"""The step's counts, summed over micro-batches: valid tokens and sequences kept for the loss, sequences checked by
the logprob-error mask."""

_REDUCTIONS = {**dict.fromkeys(COUNTS, "sum"), **METRIC_REDUCTIONS, **TOKEN_STALENESS_REDUCTIONS}


@dataclass
class _StepTotals:
    """One open step: its rows and groups on this rank, and its counts and metrics (reduced over data-parallel
    ranks when read)."""

    values: StepTotals
    rows: int = 0
    step: int | None = None
    version: int | None = None  # the trainer's weight version: token staleness is measured against it
    group_ids: dict[str, None] = field(default_factory=dict)  # insertion-ordered set

    def add(self, values: dict[str, torch.Tensor]) -> None:
        """Fold one micro-batch's counts and metrics in, each by its reduction; nothing leaves the device."""
        self.values.update(values)

    def read(self) -> dict[str, float]:
        """Every count (0 when none was added) and metric of the whole step, over all pipeline stages (only the last
        computes the loss) and data-parallel ranks."""
        if pipeline_parallel_size() > 1:
            self.values.fold_over(parallel_state.get_pipeline_model_parallel_group())
        return {**dict.fromkeys(COUNTS, 0.0), **self.values.compute()}


def normalised_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, normaliser: float, clip_grad: float
) -> tuple[float, float]:
    """Divide the accumulated raw-sum gradients by ``normaliser``, clip, step; returns (grad norm, lr used).

    ``optimizer`` may be Lightning's wrapper. An optimizer with ``scale_grads`` (megatron's stack,
    :class:`~sc_lightning.trainer.megatron_optimizer.MegatronAdamW`) holds the gradients in its own fp32 buffer
    and clips inside its step, to the same configured ``clip_grad``.
    """
    raw = getattr(optimizer, "optimizer", optimizer)
    lr = optimizer.param_groups[0]["lr"]
    if hasattr(raw, "scale_grads"):
        if raw.clip_grad != clip_grad:
            raise ValueError(
                f"the optimizer clips to its own clip_grad {raw.clip_grad}, but this update was asked to clip to "
                f"{clip_grad}: build the optimizer from the same optimizer config as the update"
            )
        raw.scale_grads(1.0 / normaliser)
        optimizer.step()
        return raw.last_grad_norm, lr
    params = [p for p in model.parameters() if p.grad is not None]
    for param in params:
        param.grad.div_(normaliser)
    grad_norm = clip_model_parallel_grads(params, clip_grad)  # the whole model's norm when it is TP/PP-split
    optimizer.step()
    return grad_norm, lr


def frozen_logprobs(
    model: torch.nn.Module,
    chunk: TrainChunk,
    *,
    micro_batch_size: int,
    vocab_size: int | None,
    temperature: float,
    micro_batch_tokens: int | None = None,
    micro_batch_width_multiple: int = 1,
) -> torch.Tensor:
    """``model``'s (B, T) logprobs of ``chunk``'s tokens, without gradient, by micro-batch: PPO's fixed pi_old, or a
    reference policy's logprobs for the KL term (through the pipeline schedule with pipeline stages).

    Positions no micro-batch ran (rows without a valid token, columns past a row's micro-batch width) are 0, and so is
    every position on a pipeline stage before the last (only the last computes the loss); no loss term reads a
    position past a row's last valid token, whatever it holds.
    """
    vocab = vocab_size if vocab_size is not None else real_vocab_size(model)

    def logprobs(rows: TrainChunk, logits: torch.Tensor) -> torch.Tensor:
        """The micro-batch's logprobs from its logits."""
        input_ids = rows.input_ids.to(logits.device)
        return logprobs_from_logits(logits, input_ids, vocab_size=vocab, temperature=temperature)

    plans = chunk.plan(micro_batch_size, micro_batch_tokens, micro_batch_width_multiple)
    return per_token_forward(model, chunk, plans, logprobs)


class PolicyUpdate:
    """Accumulates one RL step's gradients over chunks of rows and applies a single optimizer step."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: ClippedPGLoss,
        *,
        micro_batch_size: int,
        clip_grad: float,
        micro_batch_tokens: int | None = None,
        micro_batch_width_multiple: int = 1,
        trained_lengths: list[int] | None = None,
        backward: Callable[[torch.Tensor], None] | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        vocab_size: int | None = None,
        reference_model: torch.nn.Module | None = None,
        temperature: float = 1.0,
        seq_logprob_error_threshold: float | None = None,
        seq_logprob_error_knob: str = "grpo.seq_logprob_error_threshold",
        max_token_staleness: int | None = None,
        frozen_pass: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        teachers: tuple[str, ...] = (),
        full_vocabulary_coef: float = 1.0,
    ) -> None:
        if loss_fn.reference_policy_kl_penalty > 0 and reference_model is None:
            raise ValueError("loss_fn.reference_policy_kl_penalty > 0 needs a reference model for the KL term")
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.reference_model = reference_model
        self.temperature = temperature  # the engine's logprobs are of softmax(logits / T): score the same way
        self.micro_batch_size, self.clip_grad, self.scheduler = micro_batch_size, clip_grad, scheduler
        self.backward = backward or (lambda loss: loss.backward())
        self.vocab_size = vocab_size
        self.seq_logprob_error_threshold = seq_logprob_error_threshold  # rows above it leave the loss; None: log only
        self.seq_logprob_error_knob = seq_logprob_error_knob  # the threshold's config dotpath, named in errors
        self.max_token_staleness = max_token_staleness  # older tokens leave the loss; None: measure only
        self.micro_batch_tokens = micro_batch_tokens  # padded-token budget of a micro-batch; None: rows only
        self.micro_batch_width_multiple = micro_batch_width_multiple  # a micro-batch's width rounds up to it
        self.trained_lengths = [] if trained_lengths is None else trained_lengths  # each run row's length (perf)
        self.frozen_pass = frozen_pass  # wraps each frozen logprob pass (the step's perf times them)
        self.teachers = teachers  # on-policy distillation: the aliases rows' teacher_ids index (metrics per teacher)
        self.full_vocabulary_coef = full_vocabulary_coef  # weight of the full-vocabulary reverse-KL term
        self.reductions = {**_REDUCTIONS, **teacher_reductions(teachers)}
        self._totals: _StepTotals | None = None

    def begin(self, step: int | None = None, version: int | None = None) -> None:
        """Open a step (``step`` names it in errors; ``version``, the trainer's weight version, turns on the token
        staleness metrics and mask): zero the gradients and the counters."""
        if self._totals is not None:
            raise RuntimeError("begin() called twice without finish(): a train step is already open")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        group = data_parallel_group()
        device = next(self.model.parameters()).device
        values = StepTotals(self.reductions, process_group=group, sync=group is not None).to(device)
        self._totals = _StepTotals(values, step=step, version=version)

    def train_chunk(self, chunk: TrainChunk) -> None:
        """Forward/backward every micro-batch of ``chunk``; gradients accumulate as raw sums.

        Rows without a valid token are consumed but not run (they add nothing); the rest run longest first, each
        micro-batch trimmed to its longest row (:mod:`~sc_lightning.trainer.microbatch`). Nothing here waits for
        the device except planning the chunk (one read of its row lengths).
        """
        totals = self._open_step()
        vision = vision_of(self.model)
        if vision is not None:
            check_images_out_of_loss(chunk.input_ids, chunk.token_mask, vision)
        totals.rows += len(chunk)
        totals.group_ids.update(dict.fromkeys(chunk.group_ids))
        plans = chunk.plan(self.micro_batch_size, self.micro_batch_tokens, self.micro_batch_width_multiple)
        for plan in plans:
            self.trained_lengths.extend(plan.lengths)
        if self.reference_model is not None:  # read first: with pipeline stages it runs through its own schedule
            with self.frozen_pass():
                reference = self._frozen_logprobs(self.reference_model, chunk)
            chunk = dataclasses.replace(chunk, reference_logprobs=reference)
        train_microbatches(
            self.model,
            ((model_input(rows), rows) for plan in plans for rows in [chunk.select(plan)]),
            partial(self._logits_loss, totals),
            count=len(plans),
            shape=microbatch_shape(plans),
            backward=self.backward,
        )

    def _logits_loss(self, totals: _StepTotals, batch: TrainChunk, logits: torch.Tensor) -> torch.Tensor:
        """The micro-batch's loss from the policy's (last stage's) logits."""
        input_ids = batch.input_ids.to(logits.device)
        vocab = self.vocab_size if self.vocab_size is not None else real_vocab_size(self.model)
        student = None  # full-vocabulary distillation: read before logprobs_from_logits may overwrite the logits
        if batch.teacher_vocab_logprobs is not None:
            student = student_vocab_logprobs(logits, vocab or logits.shape[-1], self.temperature)
        logprobs = logprobs_from_logits(logits, input_ids, vocab_size=vocab, temperature=self.temperature)
        return self._microbatch_loss(batch, logprobs, totals, student)

    def _microbatch_loss(
        self, batch: TrainChunk, logprobs: torch.Tensor, totals: _StepTotals, student: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The micro-batch's loss as a raw sum (normaliser 1), its counts and metrics folded into ``totals``; with
        ``student`` (its (B, T, V) logprobs) the full-vocabulary reverse-KL term joins it."""
        mask = loss_mask(batch.token_mask, batch.sample_mask)
        stamped = totals.version is not None and batch.token_versions is not None
        if stamped:
            mask = mask * token_staleness_mask(batch.token_versions, totals.version, self.max_token_staleness)
        prev_logprobs = logprobs.detach() if batch.prev_logprobs is None else batch.prev_logprobs
        mask = self._mask_seq_logprob_error(batch, prev_logprobs, mask, totals)
        tokens, seqs = valid_counts(mask)
        totals.add({"tokens": tokens, "seqs": seqs})
        if stamped:
            totals.add(token_staleness_metrics(batch.token_versions, totals.version, mask))
        loss, metrics = self.loss_fn(
            logprobs,
            prev_logprobs=prev_logprobs,
            generation_logprobs=batch.generation_logprobs,
            advantages=batch.advantages,
            mask=mask,
            num_valid_tokens=1.0,
            num_valid_seqs=1.0,
            reference_logprobs=batch.reference_logprobs,
        )
        totals.add(metrics)
        totals.add(teacher_metrics(batch, mask, self.teachers))
        if student is not None:
            term, kl_metrics = full_vocabulary_term(batch, student, mask, self.full_vocabulary_coef)
            totals.add(kl_metrics)
            loss = loss + term
        return loss  # an all-masked micro-batch backpropagates 0; its metrics are neutral

    def _mask_seq_logprob_error(
        self, batch: TrainChunk, prev_logprobs: torch.Tensor, mask: torch.Tensor, totals: _StepTotals
    ) -> torch.Tensor:
        """``mask`` (B, T) with the rows above the sequence logprob-error threshold zeroed; counts their metrics."""
        errors = seq_mult_prob_error(batch.generation_logprobs, prev_logprobs, mask)  # (B,), NaN: no valid token
        masked = seq_logprob_error_mask(errors, self.seq_logprob_error_threshold)  # (B,) bool
        totals.add({"checked_seqs": (~errors.isnan()).sum()})
        totals.add(seq_logprob_error_metrics(errors, masked, batch.rewards))
        return mask * (~masked).to(mask.dtype).unsqueeze(-1)

    def _frozen_logprobs(self, model: torch.nn.Module, chunk: TrainChunk) -> torch.Tensor:
        return frozen_logprobs(
            model,
            chunk,
            micro_batch_size=self.micro_batch_size,
            micro_batch_tokens=self.micro_batch_tokens,
            micro_batch_width_multiple=self.micro_batch_width_multiple,
            vocab_size=self.vocab_size,
            temperature=self.temperature,
        )

    def finish(self) -> dict[str, float]:
        """Normalise once by the step's valid count, clip, step; returns the step's metrics (one device read)."""
        totals = self._open_step()
        self._totals = None
        read = totals.read()
        if read["tokens"] == 0:
            raise EmptyStepError(self._empty_step_message(totals, read))
        normaliser = read["tokens"] if self.loss_fn.token_level_loss else read["seqs"]
        grad_norm, lr = normalised_step(self.model, self.optimizer, normaliser, self.clip_grad)
        if self.scheduler is not None:
            self.scheduler.step()
        metrics = {}
        for name, value in read.items():
            if name in COUNTS or name.startswith("teacher_tokens/"):
                continue
            if self.reductions[name] != "sum":
                metrics[name] = value  # min / max over the step
                continue
            denominator = self._denominator(name, read)
            metrics[name] = value / denominator if denominator else 0.0  # 0 masked rows: masked_correct_pct = 0
        metrics.update(grad_norm=grad_norm, lr=lr, global_valid_toks=read["tokens"], global_valid_seqs=read["seqs"])
        return metrics

    def _empty_step_message(self, totals: _StepTotals, read: dict[str, float]) -> str:
        step = "the step" if totals.step is None else f"RL step {totals.step}"
        groups = f"groups: {', '.join(totals.group_ids)}"
        masked = int(read.get("num_masked_seqs_by_logprob_error", 0.0))
        if masked == 0:
            return (
                f"{step}: all {totals.rows} completions were filtered out (overlong filtering, "
                f"environment masks or loss_fn.max_token_staleness), nothing to train on; {groups}"
            )
        knob = f"{self.seq_logprob_error_knob}={self.seq_logprob_error_threshold}"
        return (
            f"{step}: all {totals.rows} completions were filtered out, nothing to train on: {knob} masked {masked} "
            f"of {int(read['checked_seqs'])} sequences (each one's mean over its tokens of exp|log pi_gen - log "
            f"pi_old| is above it; that error is never below 1); raise {self.seq_logprob_error_knob}, or set it to "
            f"null to only log the error; {groups}"
        )

    def _denominator(self, name: str, read: dict[str, float]) -> float:
        loss_fn = self.loss_fn
        teacher = teacher_denominator(name, read)
        if teacher is not None:
            return teacher
        seq_error_counts = {
            "mean_seq_mult_prob_error": read["checked_seqs"],
            "mean_seq_mult_prob_error_after_mask": read["seqs"],
            "masked_correct_pct": read.get("num_masked_seqs_by_logprob_error", 0.0),
        }
        if name in seq_error_counts:
            return seq_error_counts[name]
        if name in ("loss", "kl_penalty"):
            return read["tokens"] if loss_fn.token_level_loss else read["seqs"]
        if name == "is_oob_ratio":
            per_seq = loss_fn.truncated_importance_sampling_type == "seq-mask-tis"
            return read["seqs"] if per_seq or loss_fn.sequence_level_importance_ratios else read["tokens"]
        if name in ("num_valid_samples", "num_masked_seqs_by_logprob_error"):
            return 1.0
        return read["tokens"]

    def _open_step(self) -> _StepTotals:
        if self._totals is None:
            raise RuntimeError("no train step is open: call begin() first")
        return self._totals
