"""Datasets as users have them drive a fit: a Parquet file in GSM8K's layout and a save_to_disk directory of chat
prompts, two GRPO steps each through ``python -m sc_lightning fit`` (docs/datasets.md).

Each run's answers pass the arithmetic verifier's check only as the key knobs map them (a whole GSM8K solution is no
integer), so a run that trains read its rows through the knobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import QUICK, run, step_metrics
from tests.helpers.configs import TINY
from tests.helpers.dataset_files import write_rows

pytestmark = pytest.mark.slow

SUMS = [(a, b) for a in range(4) for b in range(4)]  # 16 prompts: two steps of the tiny config's 8


def fit_two_steps(tmp_path: Path, *overrides: str) -> None:
    """``fit`` of the quickest tiny run for two steps with ``overrides``; it must end well and log both steps."""
    result = run(
        "fit", "--config", TINY, *QUICK, *overrides, "--grpo.max_num_steps=2", f"--trainer.default_root_dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [row["step"] for row in step_metrics(tmp_path)] == ["0", "1"]


def test_a_parquet_file_in_gsm8ks_layout_drives_a_fit(tmp_path: Path) -> None:
    rows = [{"question": f"{a}+{b}=", "answer": f"{a}+{b}={a + b}\n#### {a + b}"} for a, b in SUMS]
    path = write_rows(tmp_path, rows, "parquet")
    fit_two_steps(
        tmp_path,
        f"--data.dataset_name={path}",
        "--data.prompt_key=question",
        "--data.answer_key=answer",
        "--data.answer_format=gsm8k",
    )


def test_a_save_to_disk_directory_of_chat_prompts_drives_a_fit(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"{a}+{b}"}], "expected_answer": a + b} for a, b in SUMS]
    path = write_rows(tmp_path, rows, "saved")
    fit_two_steps(tmp_path, f"--data.dataset_name={path}", "--data.messages_key=messages")
