"""The README's "Bring your own model and data" walkthrough, run as written: its ``my_run.yaml`` and its four commands,
in a directory holding a tiny Qwen2.5-style model written by ``transformers`` (BPE tokenizer, chat template) as
``my_model/`` and a GSM8K-layout Parquet file as ``gsm8k_train.parquet``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.helpers.cli import user_environment
from tests.helpers.configs import REPO
from tests.helpers.dataset_files import write_rows
from tests.helpers.hf_models import make_hf_model_dir
from tests.helpers.warm_cli import run_warm

pytestmark = pytest.mark.slow  # a fit, an export and a generate: a minute or two on 2 cores

SECTION = "## Walkthrough: bring your own model and data"


def walkthrough() -> tuple[str, list[str]]:
    """The section's ``my_run.yaml`` and its command lines (comments dropped)."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index(SECTION) :].split("\n## ", 1)[0]
    config = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    script = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [line.split("#", 1)[0].strip() for line in script.splitlines()]
    return config, [command for command in commands if command]


def gsm8k_rows(count: int) -> list[dict[str, str]]:
    """``count`` GSM8K-layout rows: a question, and a worked answer ending in ``#### <number>``."""
    rows = []
    for i in range(count):
        a, b = i % 7 + 1, i % 5 + 2
        question = f"Ann has {a} pens and gets {b} more. How many pens?"
        rows.append({"question": question, "answer": f"{a}+{b}\n#### {a + b}"})
    return rows


@pytest.mark.timeout(900)
def test_the_bring_your_own_model_walkthrough_runs_as_written(tmp_path: Path) -> None:
    config, commands = walkthrough()
    assert [shlex.split(c)[:4] for c in commands] == [
        ["python", "-m", "sc_lightning", "fit"],
        ["python", "-m", "sc_lightning", "fit"],
        ["python", "-m", "sc_lightning", "export"],
        ["python", "-m", "sc_lightning", "generate"],
    ]
    make_hf_model_dir(tmp_path / "my_model", "qwen2.5")
    write_rows(tmp_path, gsm8k_rows(32), "parquet", name="gsm8k_train")
    (tmp_path / "my_run.yaml").write_text(config)
    (tmp_path / "configs").symlink_to(REPO / "configs")  # the README's commands run from the repository root

    results = []
    for command in commands:  # each a fork of the tests' preloaded interpreter (tests/helpers/warm_cli.py)
        args = shlex.split(command)[3:]  # after "python -m sc_lightning"
        done = run_warm(args, cwd=str(tmp_path), env=user_environment(), timeout_s=600)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        results.append(done)

    dry_run, fit, _, generate = results
    assert "config is valid" in dry_run.stdout and "nothing was started" in dry_run.stdout
    assert "model: Qwen2ForCausalLM" in fit.stderr
    assert (tmp_path / "results/my_run/checkpoints/step_3").is_dir()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = tmp_path / "my_model_rl"
    assert AutoModelForCausalLM.from_pretrained(export).config.architectures == ["Qwen2ForCausalLM"]
    question = gsm8k_rows(1)[0]["question"]
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert tokenizer.decode(tokenizer.encode(question, add_special_tokens=False)) == question

    rows = [json.loads(line) for line in (tmp_path / "results/my_run/generations.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(row["expected_answer"] == str(int(row["expected_answer"])) for row in rows)
    assert "mean reward" in generate.stdout
