"""Dataset files as users bring them, written from rows in the tests: JSONL, Parquet, a ``save_to_disk`` directory;
and a byte-level tokenizer with a chat template, which can spell any row's text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FORMATS = ("jsonl", "parquet", "saved")
"""The dataset file formats ``data.dataset_name`` may name: :func:`write_rows` writes each."""
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_rows(directory: Path, rows: Sequence[dict[str, Any]], fmt: str, name: str = "prompts") -> Path:
    """``rows`` as a dataset of format ``fmt`` (one of :data:`FORMATS`) under ``directory``; its path."""
    if fmt == "jsonl":
        path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        return path
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = directory / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(list(rows)), path)
        return path
    if fmt == "saved":
        from datasets import Dataset

        path = directory / name
        Dataset.from_list(list(rows)).save_to_disk(str(path))
        return path
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def save_byte_level_tokenizer(path: Path) -> Path:
    """A byte-level BPE tokenizer over all 256 bytes (no merges), with bos/eos and :data:`CHAT_TEMPLATE`, saved as a
    Hugging Face tokenizer directory at ``path``."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1} | {ch: i + 2 for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path
