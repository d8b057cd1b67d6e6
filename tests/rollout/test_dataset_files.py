"""Dataset files as users bring them: JSONL, Parquet and save_to_disk directories read alike, the key knobs
(data.prompt_key, answer_key, messages_key, answer_format), the documented GSM8K and OpenMathInstruct-2 examples
(docs/datasets.md), and the errors: a missing column names the knob, the key and the file, before anything starts."""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from pathlib import Path

import pytest
import yaml

from sc_lightning.cli.load import LIGHTNING_KEYS
from sc_lightning.config import ConfigError, load_config
from sc_lightning.config.runtime import DataConfig
from sc_lightning.preflight import check_preflight
from sc_lightning.rollout.dataset_base import DatasetError
from sc_lightning.rollout.datasets import build_dataset, build_validation_set
from sc_lightning.rollout.prompt_files import FilePromptDataset
from sc_lightning.tokenizer import CharTokenizer, Tokenizer, load_tokenizer
from tests.helpers.configs import REPO, variant
from tests.helpers.dataset_files import FORMATS, save_byte_level_tokenizer, write_rows

TOK = CharTokenizer()
ARITHMETIC = [{"problem": f"{a}+{a}=", "expected_answer": 2 * a, "source": f"s{a}"} for a in range(3)]


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A byte-level tokenizer with a chat template: it spells any text, as a real model's tokenizer does."""
    return load_tokenizer(str(save_byte_level_tokenizer(tmp_path_factory.mktemp("tokenizer"))))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_gives_the_same_prompts(tmp_path: Path, fmt: str) -> None:
    """One reading path: the same rows give the same prompts from a JSONL, a Parquet and a save_to_disk dataset."""
    ds = build_dataset(DataConfig(dataset_name=str(write_rows(tmp_path, ARITHMETIC, fmt))), TOK, seed=0)
    assert isinstance(ds, FilePromptDataset)
    assert [(p.prompt_id, p.index, p.text, p.answer, dict(p.extra)) for p in ds] == [
        (f"math-{a:06d}", a, f"{a}+{a}=", str(2 * a), {"source": f"s{a}"}) for a in range(3)
    ]
    assert ds[1].token_ids == (TOK.bos_token_id, *TOK.encode("1+1="))


@pytest.mark.parametrize("fmt", ["parquet", "saved"])
def test_bad_rows_are_counted_with_their_row_index(tmp_path: Path, fmt: str) -> None:
    """A null answer and an over-long prompt: errors naming path[row] at budget 0, skipped within the budget."""
    rows = [*ARITHMETIC, {"problem": "1+1=", "expected_answer": None, "source": "x"}]
    rows.insert(1, {"problem": "11+11=11+11=", "expected_answer": 44, "source": "y"})
    path = write_rows(tmp_path, rows, fmt)
    data = DataConfig(dataset_name=str(path), max_prompt_length=8)
    with pytest.raises(DatasetError) as raised:
        build_dataset(data, TOK, seed=0)
    assert f"the prompt file {path} has 2 bad row(s), more than data.max_skipped_rows=0" in str(raised.value)
    assert f"  - {path}[1]: the prompt has 13 tokens, more than data.max_prompt_length=8" in str(raised.value)
    assert f"  - {path}[4]: key 'expected_answer' must be a string or a number, got NoneType" in str(raised.value)
    ds = build_dataset(dataclasses.replace(data, max_skipped_rows=2), TOK, seed=0)
    assert [p.text for p in ds] == ["0+0=", "1+1=", "2+2="]
    assert [where for where, _ in ds.skipped_rows] == [f"{path}[1]", f"{path}[4]"]


GSM8K_ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
        "altogether in April and May.\n#### 72",
    },
    {"question": "A shop sells 1,000 pens a day. How many pens in 2 days?", "answer": "1,000 * 2 = 2,000\n#### 2,000"},
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_gsm8k_example(tmp_path: Path, fmt: str, byte_tokenizer: Tokenizer) -> None:
    """docs/datasets.md's GSM8K example: question and answer columns, the final answer after '####', commas out."""
    path = write_rows(tmp_path, GSM8K_ROWS, fmt, name="gsm8k")
    data = DataConfig(dataset_name=str(path), prompt_key="question", answer_key="answer", answer_format="gsm8k")
    ds = build_dataset(data, byte_tokenizer, seed=0)
    assert [(p.text, p.answer, dict(p.extra)) for p in ds] == [
        (r["question"], a, {}) for r, a in zip(GSM8K_ROWS, ["72", "2000"], strict=True)
    ]
    assert byte_tokenizer.decode(list(ds[0].token_ids)) == GSM8K_ROWS[0]["question"]  # bos, then the text


def test_a_gsm8k_answer_without_its_marker_is_a_bad_row(tmp_path: Path) -> None:
    rows = [{"question": "1+1=", "answer": "1+1=2\n#### 2"}, {"question": "2+2=", "answer": "4"}]
    path = write_rows(tmp_path, [*rows, {"question": "3+3=", "answer": "6 ####  "}], "parquet")
    data = DataConfig(dataset_name=str(path), prompt_key="question", answer_key="answer", answer_format="gsm8k")
    with pytest.raises(DatasetError, match=rf"(?s){path}\[1\]: key 'answer' has no final answer after a '####'"):
        build_dataset(data, TOK, seed=0)
    ds = build_dataset(dataclasses.replace(data, max_skipped_rows=2), TOK, seed=0)
    assert [p.answer for p in ds] == ["2"]
    assert [where for where, _ in ds.skipped_rows] == [f"{path}[1]", f"{path}[2]"]


OPEN_MATH_ROWS = [
    {
        "problem": "What is the sum of the roots of $x^2 - 5x + 6 = 0$?",
        "generated_solution": "By Vieta's formulas the sum is $\\boxed{5}$.",
        "expected_answer": "5",
        "problem_source": "augmented_math",
    },
    {
        "problem": "Simplify $\\frac{6}{8}$.",
        "generated_solution": "$\\frac{6}{8} = \\boxed{\\frac{3}{4}}$",
        "expected_answer": "\\frac{3}{4}",
        "problem_source": "math",
    },
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_openmathinstruct2_example(tmp_path: Path, fmt: str, byte_tokenizer: Tokenizer) -> None:
    """docs/datasets.md's OpenMathInstruct-2 example: the default keys (problem, expected_answer) read it as it is;
    the solution and source columns ride along in Prompt.extra."""
    ds = build_dataset(DataConfig(dataset_name=str(write_rows(tmp_path, OPEN_MATH_ROWS, fmt))), byte_tokenizer, seed=0)
    assert [(p.text, p.answer) for p in ds] == [(r["problem"], r["expected_answer"]) for r in OPEN_MATH_ROWS]
    assert set(ds[1].extra) == {"generated_solution", "problem_source"}


CHAT_ROWS = [
    {"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": "3+4"}], "answer": "7"},
    {"messages": [{"role": "user", "content": "1+1"}], "answer": "2"},
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_chat_prompts_are_rendered_by_the_chat_template(tmp_path: Path, fmt: str, byte_tokenizer: Tokenizer) -> None:
    """data.messages_key: the messages rendered by the tokenizer's template with the generation prompt; the prompt's
    text is the last message's."""
    data = DataConfig(
        dataset_name=str(write_rows(tmp_path, CHAT_ROWS, fmt)), messages_key="messages", answer_key="answer"
    )
    ds = build_dataset(data, byte_tokenizer, seed=0)
    assert [(p.text, p.answer, dict(p.extra)) for p in ds] == [("3+4", "7", {}), ("1+1", "2", {})]
    assert byte_tokenizer.decode(list(ds[0].token_ids)) == "<|system|>Add.\n<|user|>3+4\n<|assistant|>"
    char = build_dataset(dataclasses.replace(data, max_skipped_rows=1), TOK, seed=0)  # "Add." is no CharTokenizer text
    assert [p.token_ids for p in char] == [(TOK.bos_token_id, *TOK.encode("1+1="))]  # its template: <bos>1+1=


def test_a_system_prompt_opens_each_text_prompt_the_chat_template_renders(
    tmp_path: Path, byte_tokenizer: Tokenizer
) -> None:
    """data.system_prompt: a system message before the text prompt's user message; the prompt's text stays its own."""
    data = DataConfig(dataset_name=str(write_rows(tmp_path, ARITHMETIC[:1], "jsonl")), apply_chat_template=True)
    (plain,) = build_dataset(data, byte_tokenizer, seed=0)
    (system,) = build_dataset(dataclasses.replace(data, system_prompt="Add."), byte_tokenizer, seed=0)
    assert byte_tokenizer.decode(list(plain.token_ids)) == "<|user|>0+0=\n<|assistant|>"
    assert byte_tokenizer.decode(list(system.token_ids)) == "<|system|>Add.\n<|user|>0+0=\n<|assistant|>"
    assert plain.text == system.text == "0+0="


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ("3+4", "key 'messages' must be a non-empty list of {role, content} messages, got '3+4'"),
        ([], "key 'messages' must be a non-empty list"),
        ([{"role": "robot", "content": "3+4"}], "key 'messages': message 0 must be {role, content} with a role of"),
        (
            [{"role": "user", "content": "3+4"}, {"role": "assistant", "content": "7"}],
            "key 'messages': the last message is the",
        ),
    ],
)
def test_a_malformed_chat_is_a_bad_row(tmp_path: Path, messages: object, reason: str) -> None:
    path = write_rows(tmp_path, [CHAT_ROWS[1], {"messages": messages, "answer": "7"}], "jsonl")
    data = DataConfig(dataset_name=str(path), messages_key="messages", answer_key="answer", max_skipped_rows=1)
    ds = build_dataset(data, TOK, seed=0)
    ((where, why),) = ds.skipped_rows
    assert where == f"{path}:2" and why.startswith(reason)


@pytest.mark.parametrize("fmt", ["parquet", "saved"])
def test_a_missing_column_fails_naming_the_knob_the_key_and_the_file(tmp_path: Path, fmt: str) -> None:
    """The schema is checked before any row: the error names each missing key's knob, the file and its columns."""
    path = write_rows(tmp_path, OPEN_MATH_ROWS, fmt, name="train")
    data = DataConfig(dataset_name=str(path), prompt_key="question", answer_key="answer")
    columns = "problem, generated_solution, expected_answer, problem_source"
    with pytest.raises(DatasetError) as raised:
        build_dataset(data, TOK, seed=0)
    assert str(raised.value) == (
        f"data.prompt_key: 'question' is not a column of {path} (columns: {columns}); set data.prompt_key to one of "
        f"them; data.answer_key: 'answer' is not a column of {path} (columns: {columns}); set data.answer_key to one "
        "of them"
    )
    with pytest.raises(DatasetError, match=rf"data\.messages_key: 'chat' is not a column of {path} "):
        build_dataset(DataConfig(dataset_name=str(path), messages_key="chat"), TOK, seed=0)


def test_preflight_refuses_a_missing_column_before_anything_starts(tmp_path: Path) -> None:
    """fit --dry_run's preflight: the training and the validation files' schemas, every missing key at once."""
    train = write_rows(tmp_path, OPEN_MATH_ROWS, "parquet", name="train")
    val = write_rows(tmp_path, OPEN_MATH_ROWS, "saved", name="val")
    raw = variant({"data": {"dataset_name": str(train), "val_dataset_name": str(val)}, "grpo": {"val_at_end": True}})
    trainer = {"default_root_dir": str(tmp_path)}
    check_preflight(load_config(raw, extra_top_level=LIGHTNING_KEYS), trainer)
    raw["data"]["prompt_key"] = "question"
    with pytest.raises(ConfigError) as raised:
        check_preflight(load_config(raw, extra_top_level=LIGHTNING_KEYS), trainer)
    columns = "problem, generated_solution, expected_answer, problem_source"
    assert [str(issue) for issue in raised.value.issues] == [
        f"data.prompt_key: 'question' is not a column of {path} (columns: {columns}); set data.prompt_key to one of "
        "them"
        for path in (train, val)
    ]


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("absent", "no such file or directory"),
        ("csv", "is not a .jsonl or .parquet file, or a directory written by datasets' save_to_disk"),
        ("not-parquet", "is not a Parquet file pyarrow can read"),
        ("plain-directory", "is a directory that datasets' load_from_disk cannot read"),
    ],
)
def test_a_path_that_is_no_dataset_file_says_why(tmp_path: Path, kind: str, problem: str) -> None:
    path = {"absent": tmp_path / "absent.parquet", "csv": tmp_path / "p.csv", "not-parquet": tmp_path / "p.parquet"}
    path["plain-directory"] = tmp_path
    for name in ("p.csv", "p.parquet"):
        (tmp_path / name).write_text("problem,expected_answer\n1+1=,2\n")
    with pytest.raises(
        DatasetError, match=rf"data\.dataset_name: is '{path[kind]}': {problem}.*; give a built-in name"
    ):
        build_dataset(DataConfig(dataset_name=str(path[kind])), TOK, seed=0)


def test_a_saved_dataset_dict_names_its_splits(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict

    rows = Dataset.from_list(ARITHMETIC)
    DatasetDict({"train": rows, "test": rows}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DatasetError, match=r"a DatasetDict of the splits train, test; give one split's directory"):
        build_dataset(DataConfig(dataset_name=str(tmp_path / "dd")), TOK, seed=0)
    assert len(build_dataset(DataConfig(dataset_name=str(tmp_path / "dd" / "train")), TOK, seed=0)) == 3


def test_values_json_cannot_hold_reach_extra_as_text(tmp_path: Path) -> None:
    """Prompt.extra must stay JSON-able (checkpoints and the endpoint write it): a Parquet date comes as its text."""
    day = datetime.date(2024, 5, 1)
    path = write_rows(tmp_path, [{**ARITHMETIC[0], "added": day, "tags": ["a", "b"]}], "parquet")
    (prompt,) = build_dataset(DataConfig(dataset_name=str(path)), TOK, seed=0)
    assert dict(prompt.extra) == {"source": "s0", "added": "2024-05-01", "tags": ["a", "b"]}


def test_a_validation_set_reads_any_format_with_the_same_keys(tmp_path: Path) -> None:
    path = write_rows(tmp_path, GSM8K_ROWS, "saved", name="val")
    data = DataConfig(
        dataset_name="arithmetic",
        val_dataset_name=str(path),
        prompt_key="question",
        answer_key="answer",
        answer_format="gsm8k",
    )
    prompts = build_validation_set(
        data, load_tokenizer(str(save_byte_level_tokenizer(tmp_path / "tok"))), max_samples=1
    )
    assert [(p.prompt_id, p.answer) for p in prompts] == [("math-000000", "72")]


DOC_EXAMPLES = re.findall(r"```json\n(.*?)```\n\n```yaml\n(.*?)```", (REPO / "docs" / "datasets.md").read_text(), re.S)


@pytest.mark.parametrize(
    ("example", "answer"), list(zip(DOC_EXAMPLES, ["72", "5", "7"], strict=True)), ids=["gsm8k", "openmath", "chat"]
)
def test_the_documented_examples_load_as_printed(
    tmp_path: Path, example: tuple[str, str], answer: str, byte_tokenizer: Tokenizer
) -> None:
    """docs/datasets.md's examples: each row, written in its config's format, loads by that config as printed."""
    row_text, config_text = example
    config = load_config(variant(yaml.safe_load(config_text)), extra_top_level=LIGHTNING_KEYS)
    path = tmp_path / config.data.dataset_name
    fmt = {".jsonl": "jsonl", ".parquet": "parquet"}.get(path.suffix, "saved")
    written = write_rows(path.parent, [json.loads(row_text)], fmt, name=path.stem if fmt != "saved" else path.name)
    assert written == path
    data = dataclasses.replace(config.data, dataset_name=str(path), max_prompt_length=512)  # not the tiny base's 16
    (prompt,) = build_dataset(data, byte_tokenizer, seed=0)
    assert prompt.answer == answer
    assert prompt.text in row_text.replace("\\\\", "\\")
