"""How a scored prompt group becomes N training rows (the schema is ``api.TRAINED_ROW``): row keys, columns, tags."""

from __future__ import annotations

import torch

from sc_lightning.controller.api import ROW_DTYPES, ROW_FIELDS
from sc_lightning.types import ScoredGroup


def row_key(group_id: str, index: int) -> str:
    """The data-plane key of generation ``index`` of a group."""
    return f"{group_id}/g{index}"


def group_to_columns(
    group_id: str, group: ScoredGroup, *, start_weight: int, end_weight: int
) -> tuple[list[str], dict[str, list[torch.Tensor]], list[dict[str, object]]]:
    """Keys, field columns (one tensor per row) and tags for the N rows of a scored group."""
    prompt, dtype = group.prompt.token_ids, ROW_DTYPES
    columns: dict[str, list[torch.Tensor]] = {name: [] for name in ROW_FIELDS}
    for index, (generation, reward) in enumerate(zip(group.generations, group.rewards, strict=True)):
        completion = generation.token_ids
        length = len(prompt) + len(completion)
        columns["input_ids"].append(torch.tensor(prompt + completion, dtype=dtype["input_ids"]))
        mask = torch.zeros(length, dtype=dtype["token_mask"])
        mask[len(prompt) :] = torch.tensor(generation.trainable, dtype=dtype["token_mask"])  # environment tokens: 0
        columns["token_mask"].append(mask)
        logprobs = torch.zeros(length, dtype=dtype["generation_logprobs"])
        logprobs[len(prompt) :] = torch.tensor(generation.logprobs, dtype=dtype["generation_logprobs"])
        columns["generation_logprobs"].append(logprobs)
        versions = torch.full((length,), -1, dtype=dtype["token_versions"])
        versions[len(prompt) :] = torch.tensor(generation.token_versions, dtype=dtype["token_versions"])
        columns["token_versions"].append(versions)
        columns["input_lengths"].append(torch.tensor(length, dtype=dtype["input_lengths"]))
        columns["prompt_lengths"].append(torch.tensor(len(prompt), dtype=dtype["prompt_lengths"]))
        columns["total_reward"].append(torch.tensor(reward, dtype=dtype["total_reward"]))
        sample_mask = 0.0 if index in group.masked else 1.0
        columns["sample_mask"].append(torch.tensor(sample_mask, dtype=dtype["sample_mask"]))
        columns["truncated"].append(torch.tensor(generation.finish_reason == "length", dtype=dtype["truncated"]))
    keys = [row_key(group_id, i) for i in range(len(group.generations))]
    tags = [
        {
            "group_id": group_id,
            "prompt_id": group.prompt.prompt_id,
            "prompt_index": group.prompt.index,
            "generation_index": i,
            "weight_version": start_weight,
            "end_weight": end_weight,
        }
        for i in range(len(keys))
    ]
    return keys, columns, tags
