"""concat_chunks: rows of several chunks become one, right-padded to the longest; a single chunk passes through."""

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
