"""``python -m sc_lightning generate`` as users run it: a policy's answers to a split's prompts, scored, written as
JSONL, summed up; bad input refused in one line before anything starts.

The slow tests run the real tiny example (megatron-core policy, colocated Megatron engine): greedy answers of the
initial policy twice (the same answers), a one-step bundle's sampled answers against ``validate`` on the same
bundle (the same pass, so the same mean reward), and a Hugging Face directory's answers to a dataset file's prompts
(its tokenizer and chat template).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sc_lightning.cli.main import main
from sc_lightning.cli.policy_run import take_options
from sc_lightning.rollout.answer_sheet import AnswerSummary
from sc_lightning.rollout.datasets import ArithmeticValidationSet
from sc_lightning.rollout.envs import ArithmeticEnvironment
from sc_lightning.rollout.envs.arithmetic import leading_integer
from sc_lightning.types import Prompt
from tests.helpers.cli import checkpointed, run
from tests.helpers.configs import TINY
from tests.helpers.dataset_files import write_rows
from tests.helpers.hf_models import make_hf_model_dir
from tests.helpers.scripts import TOKENIZER

TINY_COLOCATED = ("--config", TINY, "--config", "configs/colocated.yaml", "--data_plane.backend", "memory")


def rows_of(path: Path) -> list[dict[str, Any]]:
    """The JSONL rows ``generate`` wrote."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_scored_by_the_verifier(rows: list[dict[str, Any]]) -> None:
    """Each row's reward is the arithmetic verifier's score of its answer text, and its extracted answer the integer
    the verifier read."""
    environment = ArithmeticEnvironment()
    for row in rows:
        prompt = Prompt(row["prompt_id"], (), text=row["prompt"], answer=row["expected_answer"])
        assert row["reward"] == environment.score(prompt, row["answer"]), row
        integer = leading_integer(row["answer"])
        assert row["extracted_answer"] == (None if integer is None else str(integer)), row
        assert row["answer_tokens"] == len(row["answer_token_ids"]) > 0


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``generate *args`` in this process: exit 2 and one ``error:`` line, no traceback; that line."""
    code = main(["generate", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    return line + "\n" + err


def test_a_commands_own_options_are_taken_out_of_fits_arguments() -> None:
    args = ["--greedy", "--config", "x.yaml", "--ckpt_path=b", "--split", "val", "--a.b", "1"]
    options, rest = take_options(args, ("--ckpt_path", "--split"), ("--greedy",))
    assert options == {"--greedy": "true", "--ckpt_path": "b", "--split": "val"}
    assert rest == ["--config", "x.yaml", "--a.b", "1"]
    assert take_options(["--greedy", "false", "x"], (), ("--greedy",)) == ({"--greedy": "false"}, ["x"])
    assert take_options(["--greedy=no"], (), ("--greedy",)) == ({"--greedy": "false"}, [])


def test_bad_options_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--split takes val or train, got 'test'" in refused(capsys, *TINY_COLOCATED, "--split", "test")
    assert "--num_prompts takes a positive number or all" in refused(capsys, *TINY_COLOCATED, "--num_prompts", "0")
    assert "--greedy takes true or false, got 'maybe'" in refused(capsys, *TINY_COLOCATED, "--greedy=maybe")
    assert "--output needs a value" in refused(capsys, *TINY_COLOCATED, "--output", "--greedy")


def test_a_path_that_is_no_bundle_is_refused_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "ckpt" / "step_9"
    error = refused(capsys, *TINY_COLOCATED, "--ckpt_path", str(missing)).splitlines()[0]
    assert error.startswith(f"error: --ckpt_path {missing}: no such file or directory; give a bundle directory")
    error = refused(capsys, *TINY_COLOCATED, "--ckpt_path", str(tmp_path)).splitlines()[0]
    assert error.startswith(f"error: --ckpt_path {tmp_path}: not a checkpoint bundle (no trainer.ckpt)")
    assert not (tmp_path / "generations.jsonl").exists()


def test_a_split_without_prompts_and_a_multiturn_environment_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"problem": "1+1=", "expected_answer": 2}) + "\n")
    error = refused(capsys, *TINY_COLOCATED, f"--data.dataset_name={prompts}", "--split", "val")
    assert "data.val_dataset_name: is null and data.dataset_name has no built-in validation set" in error
    assert "use --split train" in error
    error = refused(capsys, "--config", "configs/grpo_tiny_multiturn.yaml")
    assert "env.name: is 'calculator', which is multi-turn; generate scores one completion per prompt" in error


def test_help_names_the_command_and_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "  generate " in capsys.readouterr().out
    assert main(["generate", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--ckpt_path", "--split", "--num_prompts", "--greedy", "--output"):
        assert option in out


@pytest.fixture(scope="module")
def one_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle of a one-step fit of the tiny example (colocated, in-process data plane)."""
    root = tmp_path_factory.mktemp("one_step")
    result = run(*checkpointed(root, "--grpo.max_num_steps", "1"))
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "ckpt" / "step_1"


@pytest.mark.long(minutes=2)
@pytest.mark.slow
def test_greedy_answers_of_the_initial_policy_are_the_same_twice_and_scored_by_the_verifier(tmp_path: Path) -> None:
    """Two greedy runs of the initial policy over 24 validation prompts: the same rows; the progress bar and the
    summary say what the rows hold."""
    first = run(
        "generate", *TINY_COLOCATED, "--greedy", "--num_prompts", "24", f"--trainer.default_root_dir={tmp_path / 'a'}"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    rows = rows_of(tmp_path / "a" / "generations.jsonl")  # the default output
    assert [row["prompt_id"] for row in rows] == [p.prompt_id for p in ArithmeticValidationSet(TOKENIZER)][:24]
    assert len(rows) == 24 and {row["weight_version"] for row in rows} == {0}
    assert_scored_by_the_verifier(rows)
    assert "generate (val): 100%" in first.stderr and "24/24" in first.stderr  # the bar over prompts
    out = first.stdout.splitlines()
    assert (
        out[0]
        == "generate: 24 prompts of the val split (arithmetic-val), greedy, the initial policy (builtin:tiny-arith)"
    )
    assert out[1:3] == AnswerSummary.of(rows).lines()
    assert out[-1] == f"wrote 24 answers to {tmp_path / 'a' / 'generations.jsonl'}"
    output = tmp_path / "b.jsonl"
    again = run(
        "generate",
        *TINY_COLOCATED,
        "--greedy",
        "--num_prompts=24",
        "--output",
        str(output),
        f"--trainer.default_root_dir={tmp_path / 'b'}",
        "--trainer.enable_progress_bar=false",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert rows_of(output) == rows
    assert "generate (val)" not in again.stderr  # trainer.enable_progress_bar false: no bar


@pytest.mark.long(minutes=3)
@pytest.mark.slow
def test_a_bundles_sampled_answers_score_as_its_validation_does(one_step: Path, tmp_path: Path) -> None:
    """generate and validate on the same bundle run the same pass: the same mean reward over the validation set."""
    generated = run(
        "generate",
        *TINY_COLOCATED,
        "--ckpt_path",
        str(one_step),
        "--num_prompts",
        "all",
        "--split=val",
        f"--trainer.default_root_dir={tmp_path / 'generate'}",
        "--trainer.enable_progress_bar=false",
    )
    assert generated.returncode == 0, generated.stderr[-3000:]
    rows = rows_of(tmp_path / "generate" / "generations.jsonl")
    assert len(rows) == 100 and {row["weight_version"] for row in rows} == {1}
    assert_scored_by_the_verifier(rows)
    assert f"the policy of step 1 ({one_step})" in generated.stdout.splitlines()[0]
    assert "sampled at temperature 1, top_p 1" in generated.stdout.splitlines()[0]
    validated = run(
        "validate",
        *TINY_COLOCATED,
        "--ckpt_path",
        str(one_step),
        f"--trainer.default_root_dir={tmp_path / 'validate'}",
        "--trainer.enable_progress_bar=false",
    )
    assert validated.returncode == 0, validated.stderr[-3000:]
    metrics = json.loads(validated.stdout.strip().splitlines()[-1])
    summary = AnswerSummary.of(rows)
    assert metrics["val/reward"] == pytest.approx(summary.mean_reward)
    assert metrics["val/accuracy"] == pytest.approx(summary.correct / 100)
    assert metrics["val/completion_len_mean"] == pytest.approx(summary.mean_tokens)


@pytest.mark.long(minutes=2)
@pytest.mark.slow
def test_a_hugging_face_directorys_answers_to_a_dataset_files_prompts(tmp_path: Path) -> None:
    """``--policy.model_name`` a transformers directory (random Qwen3), prompts from a JSONL file rendered by its chat
    template: without a validation set the training split is answered, each prompt as the directory's tokenizer
    renders it, each answer scored by the verifier."""
    from transformers import AutoTokenizer

    model_dir = make_hf_model_dir(tmp_path / "qwen3", "qwen3")
    sums = [(a, b) for a in range(3) for b in range(3)]
    prompts = write_rows(tmp_path, [{"problem": f"{a}+{b}=", "expected_answer": a + b} for a, b in sums], "jsonl")
    result = run(
        "generate", *TINY_COLOCATED, "--greedy",
        f"--policy.model_name={model_dir}",
        f"--data.dataset_name={prompts}",
        "--data.apply_chat_template=true",
        "--data.max_prompt_length=48",
        "--policy.max_total_sequence_length=64",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"generate: 9 prompts of the train split ({prompts}), greedy, the initial policy")
    rows = rows_of(tmp_path / "generations.jsonl")
    assert [row["prompt"] for row in rows] == [f"{a}+{b}=" for a, b in sums]
    assert_scored_by_the_verifier(rows)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    for row in rows:
        chat = [{"role": "user", "content": row["prompt"]}]
        rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert row["prompt_tokens"] == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
