"""The tokenizer make_tiny_model writes behaves exactly like CharTokenizer, through transformers and load_tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.tokenizer import CharTokenizer, HuggingFaceTokenizer, load_tokenizer

CHAR = CharTokenizer()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def hf_tokenizer(request: pytest.FixtureRequest, tiny_dirs: dict[str, Path]) -> HuggingFaceTokenizer:
    tok = load_tokenizer(str(tiny_dirs[request.param]))
    assert isinstance(tok, HuggingFaceTokenizer)
    return tok


def test_special_ids_and_vocab_match(hf_tokenizer: HuggingFaceTokenizer) -> None:
    got = (hf_tokenizer.pad_token_id, hf_tokenizer.eos_token_id, hf_tokenizer.bos_token_id, hf_tokenizer.vocab_size)
    assert got == (CHAR.PAD, CHAR.EOS, CHAR.BOS, CHAR.vocab_size)


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=CharTokenizer.CHARS, max_size=40))
def test_encode_matches_char_tokenizer(hf_tokenizer: HuggingFaceTokenizer, text: str) -> None:
    assert hf_tokenizer.encode(text) == CHAR.encode(text)


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=17), max_size=40))
def test_decode_matches_char_tokenizer(hf_tokenizer: HuggingFaceTokenizer, ids: list[int]) -> None:
    assert hf_tokenizer.decode(ids) == CHAR.decode(ids)


def test_auto_tokenizer_adds_no_tokens(tiny_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dirs["qwen2"]), local_files_only=True)
    assert len(tok) == 18
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "</s>", "<s>"]
