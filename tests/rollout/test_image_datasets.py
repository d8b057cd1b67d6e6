"""Prompts with images: dataset files whose rows list images (paths, data: URIs, Parquet bytes), the size limit,
the rows a vision-language run cannot use, and the built-in clevr dataset."""

from __future__ import annotations

import base64
import random
from pathlib import Path

import pytest

from sc_lightning.config.runtime import DataConfig
from sc_lightning.rollout.dataset_base import DatasetError
from sc_lightning.rollout.datasets import build_dataset
from sc_lightning.rollout.images import images_tensor
from sc_lightning.rollout.prompt_files import FilePromptDataset, prompt_file_issues
from sc_lightning.tasks.clevr import draw_questions, render
from sc_lightning.tokenizer import CharTokenizer
from tests.helpers.dataset_files import write_rows
from tests.helpers.images import TinyImageFormat, encoded, pattern

FMT = TinyImageFormat()
DATA = DataConfig(prompt_key="q", answer_key="a", images_key="images")


def _uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _pixels(seed: int) -> list:
    return pattern(32, 32, seed).tolist()


def test_jsonl_rows_list_image_files_beside_the_dataset_and_data_uris(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(encoded(pattern(32, 32, 1)))
    rows = [
        {"q": "<image>+<image>=", "a": "1", "images": ["img/a.png", _uri(encoded(pattern(32, 32, 2)))], "src": "x"},
        {"q": "+1=", "a": "2", "images": [_uri(encoded(pattern(32, 32, 3)))]},
    ]
    dataset = FilePromptDataset(write_rows(tmp_path, rows, "jsonl"), CharTokenizer(), DATA, images=FMT)
    first, second = dataset[0], dataset[1]
    assert [images_tensor(first.images)[i].tolist() for i in range(2)] == [_pixels(1), _pixels(2)]
    assert images_tensor(second.images)[0].tolist() == _pixels(3)
    image, tok = [FMT.image_token_id] * FMT.tokens_per_image, CharTokenizer()
    assert list(first.token_ids) == [tok.BOS, *image, *tok.encode("+"), *image, *tok.encode("=")]
    assert list(second.token_ids) == [tok.BOS, *image, *tok.encode("+1=")]
    assert first.extra == {"src": "x"}  # the images column is not copied into extra


def test_parquet_rows_carry_image_bytes(tmp_path: Path) -> None:
    rows = [{"q": "+1=", "a": "1", "images": [encoded(pattern(32, 32, seed), "PNG")]} for seed in range(3)]
    dataset = FilePromptDataset(write_rows(tmp_path, rows, "parquet"), CharTokenizer(), DATA, images=FMT)
    assert [images_tensor(p.images)[0].tolist() for p in dataset] == [_pixels(s) for s in range(3)]


def test_an_image_over_the_size_limit_fails_naming_the_knob_and_the_row(tmp_path: Path) -> None:
    big = encoded(pattern(32, 32, 4))
    (tmp_path / "big.png").write_bytes(big)
    rows = [{"q": "+1=", "a": "1", "images": ["big.png"]}, {"q": "+1=", "a": "1", "images": [_uri(big)]}]
    path = write_rows(tmp_path, rows, "jsonl")
    small = DataConfig(prompt_key="q", answer_key="a", images_key="images", max_image_bytes=len(big) - 1)
    with pytest.raises(DatasetError) as err:
        FilePromptDataset(path, CharTokenizer(), small, images=FMT)
    message = str(err.value)
    assert f"{path}:1: key 'images': image 0 ({tmp_path / 'big.png'}) is {len(big)} bytes" in message
    assert f"{path}:2: key 'images': image 0 holds" in message
    assert message.count(f"more than data.max_image_bytes={len(big) - 1}") == 2
    exact = DataConfig(prompt_key="q", answer_key="a", images_key="images", max_image_bytes=len(big))
    assert len(FilePromptDataset(path, CharTokenizer(), exact, images=FMT)) == 2


def test_rows_a_vision_language_run_cannot_use_are_bad_rows(tmp_path: Path) -> None:
    rows = [
        {"q": "+1=", "a": "1", "images": []},
        {"q": "+1=", "a": "1", "images": ["missing.png"]},
        {"q": "+1=", "a": "1", "images": [_uri(b"no image")]},
        {"q": "+1=", "a": "1", "images": ["data:image/png,raw"]},
        {"q": "+1=", "a": "1", "images": "one.png"},
        {"q": "<image>=", "a": "1", "images": [_uri(encoded(pattern(32, 32))), _uri(encoded(pattern(32, 32)))]},
        {"q": "+1=", "a": "1", "images": [_uri(encoded(pattern(32, 32)))]},
    ]
    data = DataConfig(prompt_key="q", answer_key="a", images_key="images", max_skipped_rows=6)
    dataset = FilePromptDataset(write_rows(tmp_path, rows, "jsonl"), CharTokenizer(), data, images=FMT)
    reasons = [reason for _, reason in dataset.skipped_rows]
    assert len(dataset) == 1 and len(reasons) == 6
    assert "lists no image" in reasons[0]
    assert "cannot read" in reasons[1] and "missing.png" in reasons[1]
    assert "cannot decode the image" in reasons[2]
    assert "without ';base64,'" in reasons[3]
    assert "must be a list of images" in reasons[4]
    assert "holds 1 <image> placeholder(s) for 2 image(s)" in reasons[5]


def test_images_and_the_policy_must_agree(tmp_path: Path) -> None:
    path = write_rows(tmp_path, [{"q": "+1=", "a": "1", "images": []}], "jsonl")
    with pytest.raises(DatasetError, match="data.images_key is 'images' but policy.is_vlm is False"):
        FilePromptDataset(path, CharTokenizer(), DATA)
    with pytest.raises(DatasetError, match="data.images_key is None but policy.is_vlm is True"):
        FilePromptDataset(path, CharTokenizer(), DataConfig(prompt_key="q", answer_key="a"), images=FMT)
    chat = DataConfig(prompt_key="q", answer_key="a", images_key="images", apply_chat_template=True)
    with pytest.raises(DatasetError, match="not chat-rendered"):
        FilePromptDataset(path, CharTokenizer(), chat, images=FMT)


def test_a_parquet_schema_without_the_images_column_is_refused_before_reading_rows(tmp_path: Path) -> None:
    path = write_rows(tmp_path, [{"q": "+1=", "a": "1"}], "parquet")
    _, issues = prompt_file_issues(path, DATA, "data.dataset_name")
    assert [issue.path for issue in issues] == ["data.images_key"]
    assert "'images' is not a column" in issues[0].message


def test_the_builtin_dataset_gives_each_prompt_its_scene_and_image_tokens() -> None:
    fmt, tok = TinyImageFormat(), CharTokenizer()
    dataset = build_dataset(DataConfig(dataset_name="clevr"), tok, seed=3, images=fmt)
    assert len(dataset) == 1024
    questions = draw_questions(1024, 3)
    for i in random.Random(0).sample(range(1024), 20):
        prompt, question = dataset[i], questions[i]
        assert prompt.prompt_id == f"clevr-{i:06d}" and prompt.index == i and prompt.task == "clevr"
        assert (prompt.text, prompt.answer) == (question.text, question.answer)
        assert prompt.extra == {"question": question.english, "kind": question.kind}
        assert list(prompt.token_ids) == [tok.BOS, *[fmt.image_token_id] * 16, *tok.encode(question.text)]
        assert images_tensor(prompt.images)[0].numpy().tolist() == render(question.objects).tolist()


def test_the_builtin_dataset_draws_the_kinds_data_clevr_kinds_names() -> None:
    data = DataConfig(dataset_name="clevr", clevr_kinds=("relation", "count"))
    dataset = build_dataset(data, CharTokenizer(), seed=3, images=TinyImageFormat())
    questions = draw_questions(1024, 3, ("relation", "count"))
    assert [(p.text, p.answer, p.extra["kind"]) for p in dataset] == [(q.text, q.answer, q.kind) for q in questions]
    assert [p.extra["kind"] for p in list(dataset)[:4]] == ["relation", "count", "relation", "count"]


def test_the_builtin_dataset_needs_a_vision_language_policy() -> None:
    with pytest.raises(DatasetError, match="policy.is_vlm"):
        build_dataset(DataConfig(dataset_name="clevr"), CharTokenizer(), seed=0)
