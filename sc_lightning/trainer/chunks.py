"""From selected groups to trainable tensors: read the rows, pad them, mask them, and attach GRPO advantages.

A chunk holds whole prompt groups (the sampler never splits a group), so each group's baseline is computed
inside its chunk and chunking a step never changes an advantage.

    shapes: B = rows in the chunk (groups x generations), T = longest row in the chunk; the fields read and
    their dtypes are the row schema's (``controller/api.py``: ``READ_FIELDS``, ``TRAIN_DTYPES``)
    input_ids            (B, T) long     prompt + completion, right-padded with the tokenizer's pad id
    token_mask           (B, T) float    1 on completion tokens
    generation_logprobs  (B, T) float    the engine's logprob of each completion token
    token_versions       (B, T) long     the weight version that sampled each completion token (-1 elsewhere)
    sample_mask          (B,)   float    0 for rows excluded from the loss (overlong filtering)
    advantages           (B, T) float    the row's GRPO advantage on its completion tokens
    pixel_values         B x (N_b, H, W, 3) uint8   each row's prompt images (a vision-language policy only)
    teacher_logprobs     (B, T) float    on-policy distillation: the row's teacher's logprob of each model token
    teacher_ids          (B,)   long     on-policy distillation: the row's teacher (index of its sorted alias)
    teacher_vocab_logprobs (B, T, V) float  full-vocabulary distillation: the teacher's whole distribution per token

On an on-policy distillation run (:class:`Distillation`) the advantages are the teacher's (sampled-token variant:
:func:`~sc_lightning.algorithms.opd_advantages`, plus ``reward_weight`` x GRPO's; full vocabulary: ``reward_weight`` x
GRPO's, the teacher's part being the loss's reverse-KL term).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import torch

from sc_lightning.algorithms import expand_to_tokens, grpo_advantages_by_group, loss_mask, opd_advantages
from sc_lightning.controller.api import (
    IMAGE_FIELDS,
    READ_FIELDS,
    TEACHER_FIELDS,
    TEACHER_VOCAB_FIELDS,
    TRAIN_DTYPES,
    GroupMeta,
)
from sc_lightning.data_plane.base import DataPlane, pad_rows
from sc_lightning.trainer.microbatch import MicroBatchPlan, needed_widths, plan_microbatches


@dataclass
class TrainChunk:
    """Padded tensors of whole prompt groups, ready for the loss."""

    input_ids: torch.Tensor
    token_mask: torch.Tensor
    generation_logprobs: torch.Tensor
    sample_mask: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    group_ids: list[str] = field(default_factory=list)
    start_weights: list[int] = field(default_factory=list)
    prev_logprobs: torch.Tensor | None = None  # pi_old fixed for several epochs (PPO); None: the current policy's
    reference_logprobs: torch.Tensor | None = None  # the reference policy's, read before the chunk trains (KL term)
    token_versions: torch.Tensor | None = None  # the version that sampled each token; None: not recorded
    pixel_values: list[torch.Tensor] | None = None  # each row's images, uint8 (N_b, H, W, 3); None: a text policy
    teacher_logprobs: torch.Tensor | None = None  # distillation: the teacher's logprob of each token; None: no teacher
    teacher_ids: torch.Tensor | None = None  # distillation: each row's teacher (index of its sorted alias)
    teacher_vocab_logprobs: torch.Tensor | None = None  # full-vocabulary distillation: (B, T, V)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def model_turns(self) -> torch.Tensor:
        """Each row's model turns, (B,): its maximal runs of completion tokens (1 for a single-turn completion; a
        conversation's environment tokens separate its turns)."""
        mask = self.token_mask.bool()
        return (mask[:, 1:] & ~mask[:, :-1]).sum(-1) + mask[:, 0]

    def rows(self, index: slice) -> TrainChunk:
        """A view of some rows (micro-batching); group ids and weights follow the rows."""
        return TrainChunk(**{f.name: None if (v := getattr(self, f.name)) is None else v[index] for f in fields(self)})

    def to(self, device: torch.device) -> TrainChunk:
        """The chunk on ``device``; to a GPU from pinned host memory, without blocking the host."""
        if self.input_ids.device == device:
            return self

        def move(value: object) -> object:
            """A tensor (or each of a list of tensors) on ``device``, pinned first when a CPU tensor goes to a GPU;
            anything else as it is."""
            if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
                return [move(tensor) for tensor in value]
            if not isinstance(value, torch.Tensor):
                return value
            if device.type == "cuda" and value.device.type == "cpu":
                value = value.pin_memory()
            return value.to(device, non_blocking=True)

        return TrainChunk(**{f.name: move(getattr(self, f.name)) for f in fields(self)})

    def select(self, plan: MicroBatchPlan) -> TrainChunk:
        """The rows ``plan.rows`` (in that order), their (B, T) fields cut to the first ``plan.width`` columns."""
        index = torch.tensor(plan.rows, device=self.input_ids.device)

        def take(value: object) -> object:
            """``value``'s planned rows: a tensor by index (and width), a per-row list by position (an empty one,
            not given, stays empty)."""
            if isinstance(value, torch.Tensor):
                rows = value.index_select(0, index)
                return rows[:, : plan.width] if rows.dim() >= 2 else rows
            return [value[i] for i in plan.rows] if isinstance(value, list) and value else value

        return TrainChunk(**{f.name: take(getattr(self, f.name)) for f in fields(self)})

    def plan(self, max_rows: int, max_tokens: int | None = None, width_multiple: int = 1) -> list[MicroBatchPlan]:
        """The chunk's micro-batches: rows with a valid token, longest first, within both limits, each one's width
        rounded up to ``width_multiple`` within the chunk's (one host read)."""
        widths = needed_widths(loss_mask(self.token_mask, self.sample_mask))
        return plan_microbatches(
            widths,
            max_rows=max_rows,
            max_tokens=max_tokens,
            width_multiple=width_multiple,
            max_width=self.input_ids.shape[1],
        )


def concat_chunks(chunks: Sequence[TrainChunk], pad_token_id: int) -> TrainChunk:
    """One chunk of the rows of ``chunks``, right-padded to the longest (prev_ and reference_logprobs are not
    carried; token versions, pixel values and the teacher fields are when every chunk has them)."""
    if len(chunks) == 1:
        return chunks[0]
    width = max(chunk.input_ids.shape[1] for chunk in chunks)

    def cat(name: str, pad_value: float) -> torch.Tensor:
        """The chunks' ``name`` tensors, each right-padded to ``width`` along the tokens, stacked along the rows."""
        parts = [getattr(chunk, name) for chunk in chunks]
        # (B, T) or (B, T, V): F.pad's pairs run from the last dimension, so the tokens' pair comes after V's (0, 0)
        pad = torch.nn.functional.pad
        return torch.cat([pad(p, (0, 0) * (p.dim() - 2) + (0, width - p.shape[1]), value=pad_value) for p in parts])

    def optional(name: str) -> torch.Tensor | None:
        """The chunks' per-token ``name`` tensors padded and stacked when every chunk has them, else None."""
        return None if any(getattr(c, name) is None for c in chunks) else cat(name, 0)

    return TrainChunk(
        input_ids=cat("input_ids", pad_token_id),
        token_mask=cat("token_mask", 0),
        generation_logprobs=cat("generation_logprobs", 0),
        token_versions=None if any(c.token_versions is None for c in chunks) else cat("token_versions", -1),
        sample_mask=torch.cat([chunk.sample_mask for chunk in chunks]),
        advantages=cat("advantages", 0),
        rewards=torch.cat([chunk.rewards for chunk in chunks]),
        group_ids=[g for chunk in chunks for g in chunk.group_ids],
        start_weights=[w for chunk in chunks for w in chunk.start_weights],
        pixel_values=None
        if any(c.pixel_values is None for c in chunks)
        else [p for c in chunks for p in c.pixel_values],
        teacher_logprobs=optional("teacher_logprobs"),
        teacher_ids=None if any(c.teacher_ids is None for c in chunks) else torch.cat([c.teacher_ids for c in chunks]),
        teacher_vocab_logprobs=optional("teacher_vocab_logprobs"),
    )


@dataclass(frozen=True)
class Distillation:
    """How an on-policy distillation run's chunks get their advantages (``grpo.adv_estimator.name: opd``)."""

    reward_weight: float  # of the GRPO reward advantage, added to the teacher's
    full_vocabulary: bool  # the rows hold the teacher's whole distribution (the loss compares it)


def load_chunk(
    data_plane: DataPlane,
    groups: Sequence[GroupMeta],
    *,
    pad_token_id: int,
    overlong_filtering: bool,
    leave_one_out: bool,
    normalize_rewards: bool,
    with_images: bool = False,
    distillation: Distillation | None = None,
) -> TrainChunk:
    """Read the rows of ``groups`` and build their padded tensors and GRPO advantages; with ``with_images`` (a
    vision-language policy) each row's ``pixel_values`` too (MissingRowsError naming the rows without images); with
    ``distillation``, the teacher fields and the opd advantages (MissingRowsError naming rows without a teacher)."""
    keys = [key for group in groups for key in group.keys]
    fields = [*READ_FIELDS, *(IMAGE_FIELDS if with_images else ())]
    if distillation is not None:
        fields += [TEACHER_FIELDS[1], *(TEACHER_VOCAB_FIELDS if distillation.full_vocabulary else TEACHER_FIELDS[:1])]
    rows, dtype = data_plane.get(keys, fields), TRAIN_DTYPES
    group_ids = [group.group_id for group in groups for _ in group.keys]
    rewards = torch.stack(rows["total_reward"]).to(dtype["total_reward"])
    sample_mask = torch.stack(rows["sample_mask"]).to(dtype["sample_mask"])
    if overlong_filtering:
        sample_mask = sample_mask * (~torch.stack(rows["truncated"]).to(dtype["truncated"])).to(sample_mask.dtype)
    token_mask = pad_rows(rows["token_mask"], pad_value=0).to(dtype["token_mask"])
    per_row = grpo_advantages_by_group(rewards, group_ids, leave_one_out=leave_one_out, normalize=normalize_rewards)
    chunk = TrainChunk(
        input_ids=pad_rows(rows["input_ids"], pad_value=pad_token_id).to(dtype["input_ids"]),
        token_mask=token_mask,
        generation_logprobs=pad_rows(rows["generation_logprobs"], pad_value=0).to(dtype["generation_logprobs"]),
        token_versions=pad_rows(rows["token_versions"], pad_value=-1).to(dtype["token_versions"]),
        sample_mask=sample_mask,
        advantages=expand_to_tokens(per_row, token_mask),
        rewards=rewards,
        group_ids=group_ids,
        start_weights=[group.start_weight for group in groups for _ in group.keys],
        pixel_values=rows["pixel_values"] if with_images else None,
    )
    return chunk if distillation is None else _with_teacher(chunk, rows, distillation)


def _with_teacher(chunk: TrainChunk, rows: dict[str, list[torch.Tensor]], distillation: Distillation) -> TrainChunk:
    """``chunk`` with its rows' teacher fields and the opd advantages in place of GRPO's."""
    dtype = TRAIN_DTYPES
    teacher_ids = torch.stack(rows["teacher_id"]).to(dtype["teacher_id"])
    reward_advantages = chunk.advantages * distillation.reward_weight
    if distillation.full_vocabulary:  # the teacher's part is the loss's reverse-KL term
        vocab = pad_rows(rows["teacher_vocab_logprobs"], pad_value=0).to(dtype["teacher_vocab_logprobs"])
        sampled = vocab.gather(-1, chunk.input_ids.unsqueeze(-1)).squeeze(-1)  # the sampled token's, for metrics
        teacher = torch.where(chunk.token_mask.bool(), sampled, 0.0)
        return dataclasses.replace(
            chunk,
            advantages=reward_advantages,
            teacher_logprobs=teacher,
            teacher_ids=teacher_ids,
            teacher_vocab_logprobs=vocab,
        )
    teacher = pad_rows(rows["teacher_logprobs"], pad_value=0).to(dtype["teacher_logprobs"])
    advantages = opd_advantages(
        teacher,
        chunk.generation_logprobs,
        chunk.token_mask,
        reward_advantages=chunk.advantages,
        reward_weight=distillation.reward_weight,
    )
    return dataclasses.replace(chunk, advantages=advantages, teacher_logprobs=teacher, teacher_ids=teacher_ids)
