"""Prompt datasets: the synthetic arithmetic set, JSONL files, the length limit and build_dataset (the other file
formats and the key knobs: test_dataset_files.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sc_lightning.config.runtime import DataConfig
from sc_lightning.rollout.dataset_base import LISTED_BAD_ROWS, DatasetError, PromptDataset
from sc_lightning.rollout.datasets import ARITHMETIC_DATASET_SIZE, ArithmeticDataset, build_dataset
from sc_lightning.rollout.envs import ArithmeticEnvironment, answer_check
from sc_lightning.rollout.prompt_files import FilePromptDataset
from sc_lightning.tokenizer import CharTokenizer, Tokenizer, load_tokenizer

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
    ds = FilePromptDataset(path, TOK)
    assert len(ds) == 2
    first, second = ds[0], ds[1]
    assert (first.prompt_id, first.text, first.answer, first.task) == ("math-000000", "1+2=", "3", "math")
    assert first.token_ids == (2, *TOK.encode("1+2="))
    assert dict(first.extra) == {"source": "x"}
    assert (second.prompt_id, second.answer) == ("math-000001", "20")


def test_jsonl_custom_keys_and_task(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [json.dumps({"q": "9-4=", "a": "5"})])
    ds = FilePromptDataset(path, TOK, DataConfig(prompt_key="q", answer_key="a"), task="arithmetic")
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
        (['{"problem": "hello", "expected_answer": "2"}'], r"p\.jsonl:1: cannot tokenize the prompt"),
        (['{"problem": "", "expected_answer": "2"}'], r"p\.jsonl:1: key 'problem' is an empty string"),
        (['{"problem": " \\n ", "expected_answer": "2"}'], r"p\.jsonl:1: key 'problem' is only whitespace"),
        (["[" * 100_000 + "]" * 100_000], r"p\.jsonl:1: nested too deeply to read"),
        ([""], r"p\.jsonl holds no records$"),
    ],
)
def test_jsonl_errors_name_the_file_and_line(tmp_path: Path, lines: list[str], match: str) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", lines)
    with pytest.raises(DatasetError, match=match):
        FilePromptDataset(path, TOK)


def test_jsonl_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="absent.jsonl"):
        FilePromptDataset(tmp_path / "absent.jsonl", TOK)


def test_jsonl_over_the_length_limit_names_the_prompt(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            json.dumps({"problem": "1+1=", "expected_answer": "2"}),
            json.dumps({"problem": "11+11=", "expected_answer": "22"}),
        ],
    )
    with pytest.raises(DatasetError, match=r"p\.jsonl:2: the prompt has 7 tokens, more than data\.max_prompt_length=6"):
        FilePromptDataset(path, TOK, DataConfig(max_prompt_length=6))


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
    assert isinstance(ds, FilePromptDataset)
    assert ds[0].answer == "2"
    with pytest.raises(DatasetError, match=r"p\.jsonl:1: the prompt has 5 tokens"):
        build_dataset(DataConfig(dataset_name=str(path), max_prompt_length=2), TOK, seed=0)


def test_build_dataset_unknown_name_lists_known_ones() -> None:
    with pytest.raises(DatasetError, match=r"'openmathinstruct2'.*arithmetic.*\.jsonl"):
        build_dataset(DataConfig(dataset_name="openmathinstruct2"), TOK, seed=0)


GOOD = [json.dumps({"problem": f"{a}+{a}=", "expected_answer": str(2 * a)}) for a in range(4)]
# one bad row of each kind, with (part of) the reason it must be reported with
BAD = [
    ("{not json", "not valid JSON"),
    ('["1+1=", "2"]', "expected a JSON object, got list"),
    ('{"problem": "1+1="}', "missing key 'expected_answer'"),
    ('{"problem": 5, "expected_answer": "2"}', "key 'problem' must be a string, got int"),
    ('{"problem": "hi", "expected_answer": "2"}', "cannot tokenize the prompt"),
    ('{"problem": "1234567+1=", "expected_answer": "1234568"}', "the prompt has 11 tokens, more than"),
    ('{"problem": "", "expected_answer": "0"}', "key 'problem' is an empty string"),
]
BAD_LINES = [2, 4, 6, 8, 9, 10, 11]  # where mixed_file puts them


def mixed_file(tmp_path: Path) -> Path:
    """GOOD[0], then each BAD row followed by the next GOOD row while they last (bad rows on BAD_LINES)."""
    lines = [GOOD[0]]
    for i, (bad, _) in enumerate(BAD):
        lines += [bad, *GOOD[i + 1 : i + 2]]
    return write_jsonl(tmp_path / "mixed.jsonl", lines)


def test_bad_rows_within_the_budget_are_skipped_logged_and_counted(tmp_path: Path, caplog) -> None:
    """Every kind of bad row is skipped with its file:line and reason; ids and indices stay dense."""
    path = mixed_file(tmp_path)
    with caplog.at_level("WARNING", logger="sc_lightning.rollout.datasets"):
        ds = FilePromptDataset(path, TOK, DataConfig(max_prompt_length=10, max_skipped_rows=len(BAD)))
    assert [(p.prompt_id, p.index, p.text) for p in ds] == [
        (f"math-{i:06d}", i, json.loads(GOOD[i])["problem"]) for i in range(4)
    ]
    assert [where for where, _ in ds.skipped_rows] == [f"{path}:{n}" for n in BAD_LINES]
    for (_, reason), (_, expected) in zip(ds.skipped_rows, BAD, strict=True):
        assert reason.startswith(expected)
    assert [r.getMessage() for r in caplog.records] == [
        *(f"skipped dataset row {where}: {reason}" for where, reason in ds.skipped_rows),
        f"skipped 7 bad row(s) of {path} (data.max_skipped_rows=7); 4 prompts kept",
    ]


def test_one_bad_row_over_the_budget_fails_listing_the_first_few(tmp_path: Path, caplog) -> None:
    """Budget + 1 bad rows: a DatasetError with the total, the knob, and the first LISTED_BAD_ROWS rows."""
    path = mixed_file(tmp_path)
    with caplog.at_level("WARNING"), pytest.raises(DatasetError) as raised:
        FilePromptDataset(path, TOK, DataConfig(max_prompt_length=10, max_skipped_rows=len(BAD) - 1))
    message = str(raised.value)
    assert f"{path} has 7 bad row(s), more than data.max_skipped_rows=6 allows" in message
    listed = [line for line in message.splitlines() if line.startswith("  - ")]
    assert len(listed) == LISTED_BAD_ROWS == 5
    for line, n, (_, reason) in zip(listed, BAD_LINES, BAD, strict=False):
        assert line.startswith(f"  - {path}:{n}: {reason}")
    assert message.endswith("\n  ... and 2 more")
    assert not caplog.records  # nothing was skipped: the load failed


def test_budget_zero_is_an_error_naming_the_knob(tmp_path: Path) -> None:
    """The default budget (0) keeps a bad row an error; a budget of 1 skips it."""
    path = write_jsonl(tmp_path / "p.jsonl", [GOOD[0], "{not json", GOOD[1]])
    with pytest.raises(DatasetError, match=r"(?s)1 bad row\(s\), more than data\.max_skipped_rows=0.*p\.jsonl:2: not"):
        FilePromptDataset(path, TOK)
    assert len(FilePromptDataset(path, TOK, DataConfig(max_skipped_rows=1))) == 2


def test_rows_that_are_not_utf8_are_bad_rows_and_a_byte_order_mark_is_not(tmp_path: Path) -> None:
    """A line of invalid UTF-8 is one bad row (not a failed file); a BOM before the first line is ignored."""
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD[0].encode() + b"\n" + b'{"problem": "\xff"}\n' + GOOD[1].encode() + b"\n")
    ds = FilePromptDataset(path, TOK, DataConfig(max_skipped_rows=1))
    assert [p.text for p in ds] == ["0+0=", "1+1="]
    ((where, reason),) = ds.skipped_rows
    assert where == f"{path}:2" and reason.startswith("not valid UTF-8")


def test_a_file_of_only_bad_rows_holds_no_records_even_within_the_budget(tmp_path: Path) -> None:
    """Skipping may not leave an empty dataset."""
    path = write_jsonl(tmp_path / "p.jsonl", ["{not json", "[]"])
    with pytest.raises(DatasetError, match=r"p\.jsonl holds no records \(all 2 rows were bad and skipped\)"):
        FilePromptDataset(path, TOK, DataConfig(max_skipped_rows=5))


def test_build_dataset_skips_over_long_prompts_per_data_max_skipped_rows(tmp_path: Path) -> None:
    """A prompt longer than data.max_prompt_length is a bad row: an error at budget 0, skipped within it."""
    long = json.dumps({"problem": "11+11=", "expected_answer": "22"})  # 7 tokens with the bos
    path = write_jsonl(tmp_path / "p.jsonl", [GOOD[0], long, GOOD[1]])
    strict = DataConfig(dataset_name=str(path), max_prompt_length=6)
    with pytest.raises(DatasetError, match=r"data\.max_skipped_rows=0 .*\n  - .*p\.jsonl:2: the prompt has 7 tokens"):
        build_dataset(strict, TOK, seed=0)
    lenient = DataConfig(dataset_name=str(path), max_prompt_length=6, max_skipped_rows=1)
    ds = build_dataset(lenient, TOK, seed=0)
    assert isinstance(ds, FilePromptDataset)
    assert [(p.prompt_id, p.text) for p in ds] == [("math-000000", "0+0="), ("math-000001", "1+1=")]
    assert ds.skipped_rows == [(f"{path}:2", "the prompt has 7 tokens, more than data.max_prompt_length=6")]


def test_jsonl_with_the_chat_template_opens_a_conversation_exactly(tmp_path: Path) -> None:
    """data.apply_chat_template renders each prompt as the user message a multi-turn conversation opens with."""
    from sc_lightning.rollout.multiturn.chat import ChatTemplateError, chat_template_for
    from sc_lightning.rollout.multiturn.driver import opening_session

    path = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"problem": "12*34", "expected_answer": 408})])
    template = chat_template_for(TOK)
    rendered = build_dataset(DataConfig(dataset_name=str(path), apply_chat_template=True), TOK, seed=0)[0]
    raw = build_dataset(DataConfig(dataset_name=str(path)), TOK, seed=0)[0]
    assert rendered.text == raw.text == "12*34"
    assert rendered.token_ids == (TOK.bos_token_id, *TOK.encode("12*34="))  # <bos>, the message, the turn marker
    assert raw.token_ids == (TOK.bos_token_id, *TOK.encode("12*34"))
    assert tuple(opening_session(rendered, template).token_ids) == rendered.token_ids
    with pytest.raises(ChatTemplateError, match="not its text rendered as a user message"):
        opening_session(raw, template)


@pytest.fixture(scope="module")
def warm_start_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The tokenizer every warm-started built-in (builtin:tiny-arith, builtin:tiny-calc) loads from its directory."""
    from sc_lightning.models.tiny_tokenizer import save_char_tokenizer

    path = tmp_path_factory.mktemp("warm-start")
    save_char_tokenizer(path)
    return load_tokenizer(str(path))


UNREPRESENTABLE = json.dumps({"problem": "What is three plus four?", "expected_answer": "7"})


@pytest.mark.parametrize("apply_chat_template", [False, True])
def test_a_prompt_the_warm_start_tokenizer_cannot_represent_is_a_bad_row(
    tmp_path: Path, warm_start_tokenizer: Tokenizer, apply_chat_template: bool
) -> None:
    """Over the budget: an error naming file:line and the characters; within it: skipped, the rest kept intact."""
    path = write_jsonl(tmp_path / "p.jsonl", [GOOD[0], UNREPRESENTABLE, GOOD[1]])
    cfg = DataConfig(dataset_name=str(path), apply_chat_template=apply_chat_template)
    with pytest.raises(DatasetError) as raised:
        build_dataset(cfg, warm_start_tokenizer, seed=0)
    assert f"  - {path}:2: cannot tokenize the prompt: the tokenizer" in str(raised.value)
    assert "cannot represent 'W', 'h', 'a', 't'" in str(raised.value)
    ds = build_dataset(dataclasses.replace(cfg, max_skipped_rows=1), warm_start_tokenizer, seed=0)
    assert [p.text for p in ds] == ["0+0=", "1+1="]
    assert [where for where, _ in ds.skipped_rows] == [f"{path}:2"]


def test_a_prompt_with_unknown_tokens_is_a_bad_row(tmp_path: Path) -> None:
    """A tokenizer with an [UNK] token: a prompt that encodes to it is a bad row naming the unknown pieces."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "[UNK]": 2, "two": 3, "plus": 4}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="[UNK]").save_pretrained(
        tmp_path / "tok"
    )
    rows = [json.dumps({"problem": text, "expected_answer": "4"}) for text in ("two plus two", "two plus three")]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(DatasetError, match=r"p\.jsonl:2: cannot tokenize the prompt: .*cannot represent 'three' of"):
        FilePromptDataset(path, load_tokenizer(str(tmp_path / "tok")))


def test_an_answer_the_environment_could_never_score_is_a_bad_row_at_load(tmp_path: Path) -> None:
    """The arithmetic verifier needs integers: a float answer (7.0 in JSON, or "7.5") is a bad row naming file:line
    and the reason as the file loads, instead of a RewardError in the middle of the run."""
    rows = [
        GOOD[0],
        json.dumps({"problem": "3+4=", "expected_answer": 7.0}),
        '{"problem": "3+4=", "expected_answer": "7.5"}',
    ]
    path = write_jsonl(tmp_path / "p.jsonl", [*rows, GOOD[1]])
    cfg = DataConfig(dataset_name=str(path))
    check = answer_check(ArithmeticEnvironment())
    with pytest.raises(DatasetError) as raised:
        build_dataset(cfg, TOK, seed=0, check_answer=check)
    assert f"  - {path}:2: key 'expected_answer': the arithmetic answer must be an integer, got '7.0'" in str(
        raised.value
    )
    assert f"  - {path}:3: key 'expected_answer': the arithmetic answer must be an integer, got '7.5'" in str(
        raised.value
    )
    ds = build_dataset(dataclasses.replace(cfg, max_skipped_rows=2), TOK, seed=0, check_answer=check)
    assert [p.answer for p in ds] == ["0", "2"]
    assert len(build_dataset(cfg, TOK, seed=0)) == 4  # the check is the environment's: without one, any answer loads


@pytest.mark.parametrize("name", ["arithmetic", "calculator"])
def test_a_built_in_task_the_tokenizer_cannot_spell_is_a_dataset_error(tmp_path: Path, name: str) -> None:
    """A word-level tokenizer cannot spell "3+4=": the built-in dataset fails to load, naming the knob to change."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "[UNK]": 2, "two": 3}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="[UNK]", chat_template="{{ messages }}"
    ).save_pretrained(tmp_path)
    match = rf"the built-in {name} dataset .* cannot represent .*policy\.tokenizer_name"
    with pytest.raises(DatasetError, match=match):
        build_dataset(DataConfig(dataset_name=name), load_tokenizer(str(tmp_path)), seed=0)
