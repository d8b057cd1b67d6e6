"""TrainChunk: concat_chunks right-pads rows of several chunks to the longest; model_turns counts turns."""

from __future__ import annotations

import torch

from sc_lightning.trainer.chunks import TrainChunk, concat_chunks


def chunk(rows: int, width: int, fill: float, group: str) -> TrainChunk:
    return TrainChunk(
        input_ids=torch.full((rows, width), 5),
        token_mask=torch.ones(rows, width),
        generation_logprobs=torch.full((rows, width), fill),
        sample_mask=torch.ones(rows),
        advantages=torch.full((rows, width), fill),
        rewards=torch.full((rows,), fill),
        group_ids=[group] * rows,
        start_weights=[int(fill)] * rows,
    )


def test_chunks_concatenate_right_padded() -> None:
    a, b = chunk(2, 3, 1.0, "a"), chunk(1, 5, 2.0, "b")
    both = concat_chunks([a, b], pad_token_id=0)
    assert both.input_ids.tolist() == [[5, 5, 5, 0, 0], [5, 5, 5, 0, 0], [5, 5, 5, 5, 5]]
    assert both.token_mask.sum(-1).tolist() == [3, 3, 5]  # padding is never a valid token
    assert both.advantages[:, -1].tolist() == [0.0, 0.0, 2.0]
    assert both.rewards.tolist() == [1.0, 1.0, 2.0] and both.group_ids == ["a", "a", "b"]
    assert both.start_weights == [1, 1, 2] and both.prev_logprobs is None
    assert concat_chunks([a], pad_token_id=0) is a


def test_model_turns_count_the_runs_of_completion_tokens() -> None:
    """A single-turn row is one turn, a conversation one per run of model tokens, an all-masked row none."""
    rows = chunk(4, 9, 0.0, "g")
    rows.token_mask = torch.tensor(
        [
            [0, 0, 1, 1, 1, 0, 0, 0, 0],  # prompt, one completion, padding
            [0, 0, 1, 1, 0, 0, 1, 1, 0],  # prompt, model, environment, model, padding
            [0, 1, 0, 1, 0, 1, 1, 0, 1],  # three environment gaps: four turns
            [0, 0, 0, 0, 0, 0, 0, 0, 0],
        ],
        dtype=torch.float32,
    )
    assert rows.model_turns().tolist() == [1, 2, 4, 0]
