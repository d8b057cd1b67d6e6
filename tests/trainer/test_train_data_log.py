"""train_data.jsonl rolls back to the resume step and survives a line torn by a crash."""

from __future__ import annotations

import json

import pytest

from sc_lightning.trainer.train_data_log import TrainDataLog


def rows(n: int) -> list[dict]:
    return [{"prompt_index": i, "weight_version": 0, "end_weight": 1, "reward": 1.0} for i in range(n)]


def steps_in(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_open_keeps_only_the_steps_before_the_resume_step(tmp_path) -> None:
    path = tmp_path / "train_data.jsonl"
    log = TrainDataLog(path)
    log.open(resume_step=0)
    for step in range(4):
        log.write(step, rows(2))
    log.close()
    assert steps_in(path) == [0, 0, 1, 1, 2, 2, 3, 3]
    record = json.loads(path.read_text().splitlines()[0])
    assert (record["start_weight"], record["end_weight"], record["prompt_id"]) == (0, 1, None)

    log.open(resume_step=2)  # resumed from the checkpoint taken after steps 0 and 1
    log.write(2, rows(1))
    log.close()
    assert steps_in(path) == [0, 0, 1, 1, 2]

    log.open(resume_step=0)  # a fresh run starts a fresh log
    log.close()
    assert path.read_text() == ""


def test_a_torn_last_line_is_dropped(tmp_path) -> None:
    path = tmp_path / "train_data.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"ste')
    log = TrainDataLog(path)
    log.open(resume_step=5)
    log.close()
    assert steps_in(path) == [0, 1]


def test_writing_needs_open(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="open"):
        TrainDataLog(tmp_path / "x.jsonl").write(0, rows(1))
