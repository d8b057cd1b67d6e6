"""Tokenizers: CharTokenizer round trips and special ids, the Hugging Face adapter on a local tokenizer, load errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.tokenizer import (
    CharTokenizer,
    HuggingFaceTokenizer,
    Tokenizer,
    TokenizerLoadError,
    UnrepresentableTextError,
    load_tokenizer,
)

ALPHABET_TEXT = st.text(alphabet=CharTokenizer.CHARS, max_size=64)


@given(ALPHABET_TEXT)
def test_char_tokenizer_round_trips(text: str) -> None:
    tok = CharTokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert all(3 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


@given(ALPHABET_TEXT, st.lists(st.sampled_from([0, 1, 2]), max_size=8), st.randoms())
def test_char_decode_skips_special_ids_wherever_they_are(text: str, specials: list[int], rnd) -> None:
    tok = CharTokenizer()
    ids = tok.encode(text)
    for s in specials:
        ids.insert(rnd.randint(0, len(ids)), s)
    assert tok.decode(ids) == text


def test_char_tokenizer_ids_and_vocab() -> None:
    tok = CharTokenizer()
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.vocab_size) == (0, 1, 2, 18)
    assert tok.encode("3+5=") == [6, 13, 8, 16]
    assert tok.decode([2, 6, 13, 8, 16, 1, 0, 0]) == "3+5="
    assert isinstance(tok, Tokenizer)


def test_char_decode_marks_ids_outside_the_vocabulary() -> None:
    tok = CharTokenizer()
    assert tok.decode([4, 18, 5, 100, -1]) == "1\ufffd2\ufffd\ufffd"


def test_char_encode_rejects_unknown_characters() -> None:
    with pytest.raises(ValueError, match="'x'"):
        CharTokenizer().encode("1+x=")


def test_char_encode_names_every_character_it_cannot_represent() -> None:
    with pytest.raises(UnrepresentableTextError) as raised:
        CharTokenizer().encode("1 plus 1=")
    assert raised.value.characters == ("p", "l", "u", "s")
    assert "CharTokenizer cannot represent 'p', 'l', 'u', 's' of '1 plus 1='" in str(raised.value)


@pytest.mark.parametrize(
    ("text", "lost"),
    [
        ("What is three plus four?", ("W", "h", "a", "t", "i", "s", "r", "e", "p", "l", "u", "f", "o", "?")),
        ("hello world", ("h", "e", "l", "o", "w", "r", "d")),
        ("1+2=\n", ("\n",)),  # whitespace outside the alphabet is lost too
    ],
)
def test_the_warm_start_tokenizer_refuses_what_it_would_drop(tmp_path: Path, text: str, lost: tuple) -> None:
    """The char tokenizer saved beside warm-started models (a byte-level BPE without unknown token) would drop
    characters outside its alphabet: encode refuses them, as CharTokenizer does, and keeps what it can represent."""
    from sc_lightning.models.tiny_tokenizer import save_char_tokenizer

    save_char_tokenizer(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    with pytest.raises(UnrepresentableTextError) as raised:
        tok.encode(text)
    assert raised.value.characters == lost
    assert f"the tokenizer {str(tmp_path)!r} cannot represent" in str(raised.value)
    assert tok.encode(" 12+3= 4 ") == CharTokenizer().encode(" 12+3= 4 ")


def test_a_tokenizer_with_an_unknown_token_refuses_what_it_maps_to_it(tmp_path: Path) -> None:
    """A word-level tokenizer maps words outside its vocabulary to [UNK]: encode names them; whitespace its
    pre-tokenizer splits on is not lost."""
    _save_local_hf_tokenizer(tmp_path, with_pad=True)
    tok = load_tokenizer(str(tmp_path))
    with pytest.raises(UnrepresentableTextError) as raised:
        tok.encode("hello there world?")
    assert raised.value.characters == ("there", "?")
    assert tok.encode(" hello\n\tworld ") == [4, 5]


def test_a_byte_level_tokenizer_represents_every_text(tmp_path: Path) -> None:
    """A byte-level BPE over all 256 bytes loses nothing, whatever the script or whitespace."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1} | {ch: i + 2 for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>").save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    text = "What is thrée plus 四?\n\t "
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("name", ["builtin:char", "builtin:tiny"])
def test_builtin_names_give_the_char_tokenizer(name: str) -> None:
    assert isinstance(load_tokenizer(name), CharTokenizer)


def test_unknown_builtin_lists_the_known_ones() -> None:
    with pytest.raises(TokenizerLoadError, match="builtin:char.*builtin:tiny"):
        load_tokenizer("builtin:nope")


def test_missing_hf_model_is_a_clear_error_naming_it() -> None:
    name = "sc-lightning-test/definitely-not-a-model"
    with pytest.raises(TokenizerLoadError, match=name):
        load_tokenizer(name)


def _save_local_hf_tokenizer(path: Path, *, with_pad: bool) -> None:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<s>": 2, "[UNK]": 3, "hello": 4, "world": 5}
    raw = RawTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.decoder = decoders.WordPiece()
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]"}
    if with_pad:
        special["pad_token"] = "<pad>"
    PreTrainedTokenizerFast(tokenizer_object=raw, **special).save_pretrained(path)


def test_hf_adapter_on_a_local_tokenizer(tmp_path: Path) -> None:
    _save_local_hf_tokenizer(tmp_path, with_pad=True)
    tok = load_tokenizer(str(tmp_path))
    assert isinstance(tok, HuggingFaceTokenizer)
    assert isinstance(tok, Tokenizer)
    assert tok.encode("hello world") == [4, 5]  # no special tokens added
    assert tok.decode([2, 4, 5, 1, 0]) == "hello world"
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.vocab_size) == (0, 1, 2, 6)


def test_hf_adapter_pads_with_eos_when_there_is_no_pad(tmp_path: Path) -> None:
    _save_local_hf_tokenizer(tmp_path, with_pad=False)
    tok = load_tokenizer(str(tmp_path))
    assert tok.pad_token_id == tok.eos_token_id == 1
