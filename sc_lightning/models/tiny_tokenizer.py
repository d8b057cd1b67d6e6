"""A Hugging Face tokenizer that encodes and decodes exactly like :class:`sc_lightning.tokenizer.CharTokenizer`.

Saved next to tiny models (the warm start, ``examples/make_tiny_model.py``) so ``transformers.AutoTokenizer`` and
``sc_lightning.tokenizer.load_tokenizer(path)`` both read it. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

from sc_lightning.tokenizer import CharTokenizer

SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "</s>", "bos_token": "<s>"}


def char_vocab() -> dict[str, int]:
    """Byte-level token -> id of the CharTokenizer: the three special tokens, then one token per character.

    Characters are written in GPT-2 byte-level form (the space is ``"Ġ"``), so the same files also work when
    ``transformers`` rebuilds the tokenizer with its own byte-level BPE pipeline (it does for ``qwen2`` models).
    """
    tok = CharTokenizer()
    vocab = {"<pad>": tok.PAD, "</s>": tok.EOS, "<s>": tok.BOS}
    vocab.update({("\u0120" if ch == " " else ch): tok.encode(ch)[0] for ch in tok.CHARS})
    return vocab


CHAR_CHAT_TEMPLATE = (  # CharChatTemplate (rollout/multiturn/chat.py) as Jinja: saved copies render chats alike
    "{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}={% endif %}{% endfor %}"
)


def save_char_tokenizer(path: str | Path, model_max_length: int = 256, image_token: str | None = None) -> None:
    """Save a ``transformers`` fast tokenizer that encodes/decodes exactly like CharTokenizer (with ``image_token``:
    like CharImageTokenizer, that special token the next id).

    A byte-level BPE without merges over single characters: every character is one token.
    """
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RawTokenizer
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.BPE(vocab=char_vocab(), merges=[], fuse_unk=False, byte_fallback=False))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS.values()])
    if image_token is not None:
        raw.add_special_tokens([AddedToken(image_token, special=True)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        unk_token=None,
        **SPECIAL_TOKENS,
    )
    tok.chat_template = CHAR_CHAT_TEMPLATE  # multi-turn rollouts render conversations with it
    tok.save_pretrained(str(path))
