"""Bad input through the command line, as users hit it: malformed dataset rows, a prompt the tokenizer cannot
represent, a dataset smaller than one step, and a tokenizer/model mismatch.

Each test runs ``python -m sc_lightning fit`` in a subprocess (real model, engine, controller and Trainer). Bad input
ends the command with exit code 2 and the message, no traceback, before the data plane, engine or controller
start; bad rows within ``data.max_skipped_rows`` are skipped with a warning each and the run trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import QUICK, error_lines, run, step_metrics
from tests.helpers.configs import TINY
from tests.helpers.models import make_tiny_model

pytestmark = pytest.mark.slow


def prompts_with_one_bad_row(tmp_path: Path) -> Path:
    """A JSONL of 16 arithmetic prompts whose third line is not JSON."""
    rows = [json.dumps({"problem": f"{a}+{b}=", "expected_answer": str(a + b)}) for a in range(4) for b in range(4)]
    rows.insert(2, '{"problem": "1+1=", "expected_answer": ')
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_bad_dataset_row_over_the_budget_ends_the_run_before_anything_starts(tmp_path: Path) -> None:
    """Budget 0: exit 2 naming file:line, the reason and the knob; no traceback, no step trained."""
    path = prompts_with_one_bad_row(tmp_path)
    result = run(
        "fit", "--config", TINY, *QUICK, f"--data.dataset_name={path}", f"--trainer.default_root_dir={tmp_path}"
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"error: the prompt file {path} has 1 bad row(s), more than data.max_skipped_rows=0" in result.stderr
    assert f"  - {path}:3: not valid JSON" in result.stderr
    assert not list(tmp_path.glob("lightning_logs/version_*/metrics.csv"))


def test_bad_dataset_rows_within_the_budget_are_skipped_and_the_run_trains(tmp_path: Path) -> None:
    """Budget 1: the row is skipped with a warning naming file:line and reason, and two steps train."""
    path = prompts_with_one_bad_row(tmp_path)
    result = run(
        "fit",
        "--config",
        TINY,
        *QUICK,
        f"--data.dataset_name={path}",
        "--data.max_skipped_rows=1",
        "--grpo.max_num_steps=2",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"skipped dataset row {path}:3: not valid JSON" in result.stderr
    assert f"skipped 1 bad row(s) of {path} (data.max_skipped_rows=1); 16 prompts kept" in result.stderr
    assert len(step_metrics(tmp_path)) == 2


def test_a_tokenizer_the_model_cannot_embed_ends_the_run_before_anything_starts(tmp_path: Path) -> None:
    """A model with 12 vocabulary rows and its 18-id tokenizer: exit 2 naming both knobs and sizes, no traceback."""
    model = make_tiny_model(tmp_path / "small-vocab", vocab_size=12)
    result = run(
        "fit", "--config", TINY, *QUICK, f"--policy.model_name={model}", f"--trainer.default_root_dir={tmp_path}"
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert (
        "error: tokenizer mismatch: the tokenizer of policy.model_name (policy.tokenizer_name is unset)"
        in result.stderr
    )
    assert f"policy.model_name='{model}' has 12 embedding rows" in result.stderr


def test_a_prompt_the_warm_started_model_cannot_spell_ends_the_run_before_anything_starts(tmp_path: Path) -> None:
    """The default warm-started built-in's tokenizer cannot represent "What is three plus four?": a bad row, so at
    budget 0 exit 2 naming file:line and the characters, instead of training a BOS and four spaces."""
    path = tmp_path / "prompts.jsonl"
    rows = [{"problem": f"{a}+{a}=", "expected_answer": str(2 * a)} for a in range(8)]
    rows.insert(1, {"problem": "What is three plus four?", "expected_answer": "7"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run(
        "fit", "--config", TINY, *QUICK, f"--data.dataset_name={path}", f"--trainer.default_root_dir={tmp_path}"
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"error: the prompt file {path} has 1 bad row(s), more than data.max_skipped_rows=0" in result.stderr
    assert f"  - {path}:2: cannot tokenize the prompt: the tokenizer" in result.stderr
    assert "cannot represent 'W', 'h', 'a', 't'" in result.stderr
    assert not list(tmp_path.glob("lightning_logs/version_*/metrics.csv"))


def test_a_dataset_smaller_than_one_step_ends_the_run_before_anything_starts(tmp_path: Path) -> None:
    """4 prompts for steps of 8: one error line naming the count, grpo.num_prompts_per_step and the fix; exit 2."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{a}+1=", "expected_answer": str(a + 1)}) + "\n" for a in range(4)))
    result = run(
        "fit",
        "--config",
        TINY,
        *QUICK,
        f"--data.dataset_name={path}",
        "--grpo.num_prompts_per_step=8",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert error_lines(result.stderr) == [
        f"error: the dataset '{path}' (data.dataset_name) holds 4 prompts, fewer than one RL step takes "
        "(grpo.num_prompts_per_step=8); set grpo.num_prompts_per_step to at most 4, or use 8 or more prompts"
    ]
    assert not list(tmp_path.glob("lightning_logs/version_*/metrics.csv"))
