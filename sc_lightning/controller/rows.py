"""How a scored prompt group becomes N training rows (the schema is ``api.TRAINED_ROW``): row keys, columns, tags."""

from __future__ import annotations

import torch

from sc_lightning.controller.api import ROW_DTYPES, ROW_FIELDS
from sc_lightning.rollout.images import images_tensor
from sc_lightning.types import ScoredGroup


def row_key(group_id: str, index: int) -> str:
    """The data-plane key of generation ``index`` of a group."""
    return f"{group_id}/g{index}"


def group_to_columns(
    group_id: str, group: ScoredGroup, *, start_weight: int, end_weight: int
) -> tuple[list[str], dict[str, list[torch.Tensor]], list[dict[str, object]]]:
    """Keys, field columns (one tensor per row) and tags for the N rows of a scored group (``pixel_values`` only when
    its prompt has images: every row holds them all; the teacher fields and tag only when a distillation teacher
    scored it)."""
    prompt, generations = group.prompt.token_ids, group.generations
    if len(group.rewards) != len(generations):
        raise ValueError(f"group {group_id}: {len(group.rewards)} rewards for {len(generations)} generations")
    before = len(prompt)  # per-token fields hold the prompt's value on its tokens: one tensor per row and field

    def tensor(name: str, values: list) -> torch.Tensor:
        """``values`` as field ``name``'s data-plane dtype."""
        return torch.tensor(values, dtype=ROW_DTYPES[name])

    columns = {
        "input_ids": [tensor("input_ids", [*prompt, *g.token_ids]) for g in generations],
        "token_mask": [tensor("token_mask", [0] * before + [*g.trainable]) for g in generations],  # env tokens: 0
        "generation_logprobs": [tensor("generation_logprobs", [0.0] * before + [*g.logprobs]) for g in generations],
        "token_versions": [tensor("token_versions", [-1] * before + [*g.token_versions]) for g in generations],
    }
    per_row = {  # one tensor per field for the whole group, then a view per row
        "input_lengths": [before + len(g.token_ids) for g in generations],
        "prompt_lengths": [before] * len(generations),
        "total_reward": list(group.rewards),
        "sample_mask": [0.0 if i in group.masked else 1.0 for i in range(len(generations))],
        "truncated": [g.finish_reason == "length" for g in generations],
    }
    columns.update({name: list(tensor(name, values).unbind()) for name, values in per_row.items()})
    columns = {name: columns[name] for name in ROW_FIELDS}
    if group.prompt.images:
        columns["pixel_values"] = [images_tensor(group.prompt.images)] * len(generations)  # the put copies each row
    if group.teacher is not None:  # on-policy distillation: the routed teacher's logprobs, and which teacher
        name = "teacher_vocab_logprobs" if group.teacher.logprobs[0].dim() == 2 else "teacher_logprobs"
        columns[name] = [row.to(ROW_DTYPES[name]) for row in group.teacher.logprobs]
        columns["teacher_id"] = list(tensor("teacher_id", [group.teacher.index] * len(generations)).unbind())
    keys = [row_key(group_id, i) for i in range(len(group.generations))]
    tags = [
        {
            "group_id": group_id,
            "prompt_id": group.prompt.prompt_id,
            "prompt_index": group.prompt.index,
            "generation_index": i,
            "weight_version": start_weight,
            "end_weight": end_weight,
            **({"teacher": group.teacher.alias} if group.teacher is not None else {}),
        }
        for i in range(len(keys))
    ]
    return keys, columns, tags
