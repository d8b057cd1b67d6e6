"""Reading a run directory: resumed versions join in step order, torn lines are skipped, train data fills gaps."""

from __future__ import annotations

import json
from pathlib import Path

from sc_lightning.report.tables import read_run
from tests.helpers.run_dirs import write_version

HEADER = "epoch,step,train/reward,timing/train/total_step_time\n"


def test_a_resumed_run_joins_its_versions_and_the_later_one_replaces_replayed_steps(tmp_path: Path) -> None:
    # version_0 logged steps 0-3 before the kill; the run resumed from step 2's checkpoint as version_1 (2-4),
    # and version_10 sorts after version_1 by number, not by name
    write_version(tmp_path, 0, HEADER + "0,0,0.1,1.0\n0,1,0.2,1.0\n0,2,0.3,1.0\n0,3,0.4,1.0\n")
    write_version(tmp_path, 1, HEADER + "0,2,0.5,2.0\n0,3,0.6,2.0\n0,4,0.7,2.0\n")
    write_version(tmp_path, 10, HEADER + "0,5,0.8,3.0\n0,6,0.9,")  # the last line torn by a kill
    run = read_run(tmp_path)
    assert [path.parent.name for path in run.metrics_files] == ["version_0", "version_1", "version_10"]
    assert run.series("train/reward") == ((0.0, 1.0, 2.0, 3.0, 4.0, 5.0), (0.1, 0.2, 0.5, 0.6, 0.7, 0.8))
    assert run.wall_time() == {0: 1.0, 1: 2.0, 2: 4.0, 3: 6.0, 4: 8.0, 5: 11.0}


def test_rows_of_one_step_merge_and_blank_cells_are_absent(tmp_path: Path) -> None:
    write_version(tmp_path, 0, "step,train/reward,val/reward\n0,0.5,\n0,,0.25\n1,0.75,\n")
    run = read_run(tmp_path)
    assert run.metrics == {0: {"train/reward": 0.5, "val/reward": 0.25}, 1: {"train/reward": 0.75}}
    assert run.columns("val/") == ["val/reward"]


def test_reward_comes_from_the_csv_and_train_data_fills_the_steps_it_lacks(tmp_path: Path) -> None:
    write_version(tmp_path, 0, HEADER + "0,0,0.9,1.0\n")
    rows = [{"step": step, "reward": reward, "start_weight": 0} for step, reward in [(0, 0), (0, 1), (1, 1), (1, 0)]]
    lines = [json.dumps(row) for row in rows] + ['{"step": 2, "rew']  # torn: it and anything after are ignored
    (tmp_path / "train_data.jsonl").write_text("\n".join(lines) + "\n")
    run = read_run(tmp_path)
    assert len(run.samples) == 4
    assert run.reward() == ((0.0, 1.0), (0.9, 0.5))  # step 0: the CSV's value wins over the samples' mean


def test_an_empty_run_directory_reads_as_empty_tables(tmp_path: Path) -> None:
    run = read_run(tmp_path)
    assert (run.metrics, run.samples, run.info, run.metrics_files) == ({}, [], None, ())
    assert run.reward() == ((), ())
