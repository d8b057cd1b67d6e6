"""Prompt datasets: the synthetic arithmetic set, JSONL files, the length limit and build_dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sc_lightning.config.runtime import DataConfig
from sc_lightning.rollout.datasets import (
    ARITHMETIC_DATASET_SIZE,
    ArithmeticDataset,
    DatasetError,
    JsonlPromptDataset,
    PromptDataset,
    build_dataset,
)
from sc_lightning.rollout.envs import ArithmeticEnvironment
from sc_lightning.tokenizer import CharTokenizer

TOK = CharTokenizer()


def test_arithmetic_prompts_are_well_formed() -> None:
    ds = ArithmeticDataset(64, seed=3, tokenizer=TOK)
    assert isinstance(ds, PromptDataset)
    assert len(ds) == 64
    env = ArithmeticEnvironment()
    for i, p in enumerate(ds):
        assert p.prompt_id == f"arithmetic-{i:06d}"
        assert p.task == "arithmetic"
        a, b = p.text.removesuffix("=").split("+")
        assert p.text == f"{a}+{b}=" and len(a) == len(b) == 1
        assert p.answer == str(int(a) + int(b))
        assert p.token_ids == (TOK.bos_token_id, *TOK.encode(p.text))
        assert env.score(p, p.answer) == 1.0
    assert ds[42].prompt_id == "arithmetic-000042"


def test_arithmetic_is_deterministic_in_the_seed() -> None:
    one, again, other = (ArithmeticDataset(100, s, TOK) for s in (7, 7, 8))
    assert list(one) == list(again)
    assert [p.text for p in one] != [p.text for p in other]
    assert len({p.text for p in one}) > 40  # covers many of the 100 sums


def test_arithmetic_over_the_length_limit_names_the_prompt() -> None:
    ArithmeticDataset(4, 0, TOK, max_prompt_length=5)
    with pytest.raises(DatasetError, match="arithmetic-000000.*max_prompt_length=4"):
        ArithmeticDataset(4, 0, TOK, max_prompt_length=4)


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_reads_records(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            json.dumps({"problem": "1+2=", "expected_answer": "3", "source": "x"}),
            "",
            json.dumps({"problem": "4*5=", "expected_answer": 20}),
        ],
    )
    ds = JsonlPromptDataset(path, TOK)
    assert len(ds) == 2
    first, second = ds[0], ds[1]
    assert (first.prompt_id, first.text, first.answer, first.task) == ("math-000000", "1+2=", "3", "math")
    assert first.token_ids == (2, *TOK.encode("1+2="))
    assert dict(first.extra) == {"source": "x"}
    assert (second.prompt_id, second.answer) == ("math-000001", "20")


def test_jsonl_custom_keys_and_task(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [json.dumps({"q": "9-4=", "a": "5"})])
    ds = JsonlPromptDataset(path, TOK, prompt_key="q", answer_key="a", task="arithmetic")
    assert (ds[0].prompt_id, ds[0].answer, ds[0].task) == ("arithmetic-000000", "5", "arithmetic")


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (['{"problem": "1+1=", "expected_answer": "2"}', "{not json"], r"p\.jsonl:2: not valid JSON"),
        (['{"problem": "1+1="}'], r"p\.jsonl:1: missing key 'expected_answer'"),
        (['{"expected_answer": "2"}'], r"p\.jsonl:1: missing key 'problem'"),
        (['["1+1=", "2"]'], r"p\.jsonl:1: expected a JSON object"),
        (['{"problem": 5, "expected_answer": "2"}'], r"p\.jsonl:1: key 'problem' must be a string"),
        (['{"problem": "1+1=", "expected_answer": null}'], r"p\.jsonl:1: key 'expected_answer' must be"),
        (['{"problem": "hello", "expected_answer": "2"}'], r"p\.jsonl:1: cannot tokenize prompt math-000000"),
        ([""], r"p\.jsonl holds no records"),
    ],
)
def test_jsonl_errors_name_the_file_and_line(tmp_path: Path, lines: list[str], match: str) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", lines)
    with pytest.raises(DatasetError, match=match):
        JsonlPromptDataset(path, TOK)


def test_jsonl_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="absent.jsonl"):
        JsonlPromptDataset(tmp_path / "absent.jsonl", TOK)


def test_jsonl_over_the_length_limit_names_the_prompt(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            json.dumps({"problem": "1+1=", "expected_answer": "2"}),
            json.dumps({"problem": "11+11=", "expected_answer": "22"}),
        ],
    )
    with pytest.raises(DatasetError, match=r"prompt math-000001 in .*p\.jsonl:2 has 7 tokens.*=6"):
        JsonlPromptDataset(path, TOK, max_prompt_length=6)


def test_build_dataset_arithmetic() -> None:
    ds = build_dataset(DataConfig(dataset_name="arithmetic", max_prompt_length=16), TOK, seed=7)
    assert isinstance(ds, ArithmeticDataset)
    assert len(ds) == ARITHMETIC_DATASET_SIZE == 512
    assert list(ds) == list(build_dataset(DataConfig(), TOK, seed=7))
    with pytest.raises(DatasetError, match="arithmetic-000000"):
        build_dataset(DataConfig(dataset_name="arithmetic", max_prompt_length=3), TOK, seed=7)


def test_build_dataset_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"problem": "1+1=", "expected_answer": "2"})])
    ds = build_dataset(DataConfig(dataset_name=str(path)), TOK, seed=0)
    assert isinstance(ds, JsonlPromptDataset)
    assert ds[0].answer == "2"
    with pytest.raises(DatasetError, match="math-000000"):
        build_dataset(DataConfig(dataset_name=str(path), max_prompt_length=2), TOK, seed=0)


def test_build_dataset_unknown_name_lists_known_ones() -> None:
    with pytest.raises(DatasetError, match=r"'openmathinstruct2'.*arithmetic.*\.jsonl"):
        build_dataset(DataConfig(dataset_name="openmathinstruct2"), TOK, seed=0)
