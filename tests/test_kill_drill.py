"""scripts/kill_drill.py's own checks, on histories written here (the drill itself runs on two CPU ranks in
tests/lightning/test_multi_rank.py): a prompt trained in two groups, a row twice, or a missing step fails it."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.configs import REPO

SCRIPT = REPO / "scripts" / "kill_drill.py"


def _drill() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kill_drill", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _history(run_dir: Path, rows: list[tuple[int, str, str, int]]) -> None:
    """train_data.jsonl of (step, prompt_id, group_id, generation_index) rows."""
    lines = [
        json.dumps({"step": s, "prompt_id": p, "group_id": g, "generation_index": i, "reward": 0.0})
        for s, p, g, i in rows
    ]
    (run_dir / "train_data.jsonl").write_text("".join(f"{line}\n" for line in lines))


CLEAN = [(0, "p0", "g0", 0), (0, "p0", "g0", 1), (1, "p1", "g1", 0), (1, "p1", "g1", 1)]


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        (CLEAN + [(2, "p0", "g2", 0)], "prompts ['p0']"),  # p0 again, in a group regenerated after a resume
        (CLEAN + [(1, "p1", "g1", 1)], "rows (group, generation) [('g1', 1)]"),  # a row of g1 twice
        ([row for row in CLEAN if row[0] == 1], "steps are not 0..N-1: [1]"),  # step 0 missing
    ],
)
def test_the_history_check_fails_on_a_prompt_trained_twice_or_a_missing_step(
    tmp_path: Path, rows: list[tuple[int, str, str, int]], problem: str
) -> None:
    drill = _drill()
    _history(tmp_path, CLEAN)
    drill.check_trained_once(tmp_path)  # the clean history passes
    _history(tmp_path, rows)
    with pytest.raises(drill.DrillFailed, match=re.escape(problem)):
        drill.check_trained_once(tmp_path)


def test_the_drill_refuses_the_leader_rank_and_a_run_directory_in_use(tmp_path: Path) -> None:
    argv = [sys.executable, str(SCRIPT), "--dir", str(tmp_path), "--rank", "0", "--", "--config", "x.yaml"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--rank must be >= 1" in done.stderr
    (tmp_path / "checkpoints").mkdir()
    done = subprocess.run([*argv[:4], "--", "--config", "x.yaml"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "holds a run already" in done.stderr
