"""How a scored prompt group becomes N training rows: the fields, their dtypes and the row keys and tags."""

from __future__ import annotations

import torch

from sc_lightning.types import ScoredGroup

ROW_FIELDS = (
    "input_ids",
    "token_mask",
    "generation_logprobs",
    "input_lengths",
    "prompt_lengths",
    "total_reward",
    "sample_mask",
    "truncated",
)
"""Fields written at commit. Per-token (jagged, aligned with input_ids): input_ids (int32), token_mask (int8: 1 on
completion tokens), generation_logprobs (float32: the engine's logprob of each completion token, 0 on the prompt).
Per-row scalars: input_lengths, prompt_lengths (int32), total_reward, sample_mask (float32), truncated (bool)."""


def row_key(group_id: str, index: int) -> str:
    """The data-plane key of generation ``index`` of a group."""
    return f"{group_id}/g{index}"


def group_to_columns(
    group_id: str, group: ScoredGroup, *, start_weight: int, end_weight: int
) -> tuple[list[str], dict[str, list[torch.Tensor]], list[dict[str, object]]]:
    """Keys, field columns (one tensor per row) and tags for the N rows of a scored group."""
    prompt = group.prompt.token_ids
    columns: dict[str, list[torch.Tensor]] = {name: [] for name in ROW_FIELDS}
    for index, (generation, reward) in enumerate(zip(group.generations, group.rewards, strict=True)):
        completion = generation.token_ids
        length = len(prompt) + len(completion)
        columns["input_ids"].append(torch.tensor(prompt + completion, dtype=torch.int32))
        mask = torch.zeros(length, dtype=torch.int8)
        mask[len(prompt) :] = 1
        columns["token_mask"].append(mask)
        logprobs = torch.zeros(length, dtype=torch.float32)
        logprobs[len(prompt) :] = torch.tensor(generation.logprobs, dtype=torch.float32)
        columns["generation_logprobs"].append(logprobs)
        columns["input_lengths"].append(torch.tensor(length, dtype=torch.int32))
        columns["prompt_lengths"].append(torch.tensor(len(prompt), dtype=torch.int32))
        columns["total_reward"].append(torch.tensor(reward, dtype=torch.float32))
        columns["sample_mask"].append(torch.tensor(0.0 if index in group.masked else 1.0, dtype=torch.float32))
        columns["truncated"].append(torch.tensor(generation.finish_reason == "length"))
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
