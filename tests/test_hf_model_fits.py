"""``fit`` from a Hugging Face directory as a user brings one: for each supported architecture, a tiny random model
written by ``transformers`` with its BPE tokenizer and chat template trains 3 GRPO steps through
``python -m sc_lightning fit`` (colocated Megatron engine, in-process data plane), its prompts rendered by the
directory's chat template after ``data.system_prompt``.

A trained row's tokens decode, with the directory's own tokenizer, to that rendering of one of the dataset's prompts:
the run used the directory's tokenizer, special tokens and template end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import QUICK, run, step_metrics
from tests.helpers.configs import TINY
from tests.helpers.dataset_files import write_rows
from tests.helpers.hf_models import HF_ARCHITECTURES, make_hf_model_dir

pytestmark = pytest.mark.slow

SYSTEM = "Add the numbers."
SUMS = [(a, b) for a in range(4) for b in range(4)]  # 16 prompts: 3 steps of 4 groups


@pytest.mark.parametrize("name", list(HF_ARCHITECTURES))
def test_fit_trains_three_steps_from_a_transformers_directory(tmp_path: Path, name: str) -> None:
    from transformers import AutoTokenizer

    model_dir = make_hf_model_dir(tmp_path / name, name)
    prompts = write_rows(tmp_path, [{"problem": f"{a}+{b}=", "expected_answer": a + b} for a, b in SUMS], "jsonl")
    result = run(
        "fit", "--config", TINY, *QUICK, "--config", "tests/small_steps.yaml",
        f"--policy.model_name={model_dir}",
        f"--data.dataset_name={prompts}",
        "--data.apply_chat_template=true",
        f"--data.system_prompt={SYSTEM}",
        "--data.max_prompt_length=48",
        "--policy.max_total_sequence_length=64",
        "--grpo.max_num_steps=3",
        '--trainer.callbacks=[{"class_path": "tests.helpers.callbacks.TrainedTokens"}]',
        f"--trainer.default_root_dir={tmp_path}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert [row["step"] for row in step_metrics(tmp_path)] == ["0", "1", "2"]
    architecture = json.loads((model_dir / "config.json").read_text())["architectures"][0]
    assert f"model: {architecture}, vocabulary " in result.stderr
    assert f"tokenizer {model_dir} (chat template)" in result.stderr

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rendered = {
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{a}+{b}="}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for a, b in SUMS
    }
    rows = [json.loads(line) for line in (tmp_path / "trained_tokens.jsonl").read_text().splitlines()]
    assert {row["step"] for row in rows} == {0, 1, 2} and len(rows) == 3 * 16
    for row in rows:
        completion_start = row["token_mask"].index(1)
        prompt = tokenizer.decode(row["input_ids"][:completion_start], skip_special_tokens=False)
        assert prompt in rendered, prompt
