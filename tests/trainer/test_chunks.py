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


def test_concatenation_carries_the_sample_mask_token_versions_and_teacher_fields() -> None:
    """The fields only some runs fill (per-token versions, a distillation's teacher logprobs) come along when every
    chunk has them, padded like the tokens (versions with -1); a row masked out stays masked out."""
    a, b = chunk(2, 3, 1.0, "a"), chunk(1, 5, 2.0, "b")
    a.sample_mask = torch.tensor([1.0, 0.0])
    a.token_versions, b.token_versions = torch.full((2, 3), 4), torch.full((1, 5), 5)
    a.teacher_logprobs, b.teacher_logprobs = torch.full((2, 3), -1.0), torch.full((1, 5), -2.0)
    both = concat_chunks([a, b], pad_token_id=0)
    assert both.sample_mask.tolist() == [1.0, 0.0, 1.0]
    assert both.token_versions.tolist() == [[4, 4, 4, -1, -1], [4, 4, 4, -1, -1], [5, 5, 5, 5, 5]]
    assert both.teacher_logprobs[:, -1].tolist() == [0.0, 0.0, -2.0] and both.teacher_logprobs[0, 0] == -1.0
    b.token_versions = None  # one chunk without: none
    assert concat_chunks([a, b], pad_token_id=0).token_versions is None


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


def test_pixel_values_follow_their_rows_through_concat_views_plans_and_moves() -> None:
    """Each row's images (a vision-language policy's) stay with the row: concatenated, sliced, planned, moved."""
    a, b = chunk(2, 3, 1.0, "a"), chunk(1, 5, 2.0, "b")
    a.pixel_values = [torch.full((1, 4, 4, 3), i, dtype=torch.uint8) for i in (1, 2)]
    b.pixel_values = [torch.full((2, 4, 4, 3), 3, dtype=torch.uint8)]
    both = concat_chunks([a, b], pad_token_id=0)
    assert [int(p[0, 0, 0, 0]) for p in both.pixel_values] == [1, 2, 3]
    assert [int(p[0, 0, 0, 0]) for p in both.rows(slice(1, 3)).pixel_values] == [2, 3]
    plan = both.plan(max_rows=2)[0]  # the longest rows first: the third, then the first
    assert [int(p[0, 0, 0, 0]) for p in both.select(plan).pixel_values] == [
        both.pixel_values[i][0, 0, 0, 0] for i in plan.rows
    ]
    moved = both.to(torch.device("meta"))
    assert all(p.device.type == "meta" for p in moved.pixel_values) and moved.group_ids == both.group_ids
    assert concat_chunks([a, chunk(1, 2, 0.0, "c")], pad_token_id=0).pixel_values is None  # not every chunk has them
