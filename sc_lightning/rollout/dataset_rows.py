"""A dataset file's row as a prompt's parts: which columns hold them and how the answer is written (docs/datasets.md).

``data.prompt_key`` names the column of a prompt's text, or ``data.messages_key`` the column of a prompt given as
chat messages (a list of ``{role, content}``); ``data.answer_key`` names the column of the reference answer, which
``data.answer_format`` reads: ``plain`` takes it whole, ``gsm8k`` takes what follows its last ``####``, as GSM8K's
worked solutions end (``... so she has 5 + 3 = 8 apples.\\n#### 8``). A file whose schema lacks a column is refused
at once (:func:`column_issues`); a row that lacks one, or holds the wrong type, is a :class:`BadRow`.

``data.images_key`` names the column of a prompt's images (a vision-language policy): a list whose entries are image
files' paths (relative to the dataset file's directory, or absolute), ``data:<type>;base64,<data>`` URIs (a Parquet
binary value comes as one), or ``datasets``' Image values (``{"bytes", "path"}``); each entry's encoded bytes are
read here, and one over ``data.max_image_bytes`` makes the row a :class:`BadRow` naming the knob.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_lightning.config.knobs import ConfigIssue
from sc_lightning.config.runtime import DataConfig
from sc_lightning.rollout.dataset_files import BadRow

ROLES = ("system", "user", "assistant", "tool")
"""The roles a chat message of a dataset row may have."""
Chat = tuple[tuple[str, str], ...]
"""A prompt given as chat messages: its ``(role, content)`` pairs, in order."""
GSM8K_MARKER = "####"


@dataclass(frozen=True)
class RowPrompt:
    """What a row gives its prompt: the text, what to render (the text, or the chat), the answer, the other columns."""

    text: str  # the prompt's text; for a chat, its last message's content
    prompt: str | Chat
    answer: str
    extra: dict[str, Any]
    images: tuple[bytes, ...] = ()  # each image's encoded bytes (a PNG or JPEG file's), from data.images_key


def required_columns(data: DataConfig) -> dict[str, str]:
    """The columns a row needs, by the knob that names each."""
    prompt = (
        {"data.messages_key": data.messages_key}
        if data.messages_key is not None
        else {"data.prompt_key": data.prompt_key}
    )
    images = {"data.images_key": data.images_key} if data.images_key is not None else {}
    return {**prompt, "data.answer_key": data.answer_key, **images}


def column_issues(data: DataConfig, columns: Collection[str], path: Path) -> list[ConfigIssue]:
    """One issue per required column missing from ``columns`` (the file's schema), naming the knob, the file and the
    columns it has."""
    listed = ", ".join(columns) or "none"
    return [
        ConfigIssue(knob, f"{key!r} is not a column of {path} (columns: {listed}); set {knob} to one of them")
        for knob, key in required_columns(data).items()
        if key not in columns
    ]


def read_row(record: Mapping[str, Any], data: DataConfig, directory: Path) -> RowPrompt:
    """The prompt's parts in ``record`` as the key knobs map them (image paths relative to ``directory``, the dataset
    file's); BadRow naming the reason when it cannot be used."""
    columns = required_columns(data)
    if data.messages_key is None:
        text = _field(record, data.prompt_key, allow_numbers=False)
        if not text.strip():
            raise BadRow(f"key {data.prompt_key!r} is {'an empty string' if not text else 'only whitespace'}")
        prompt: str | Chat = text
    else:
        prompt = _chat(record, data.messages_key)
        text = prompt[-1][1]
    answer = _field(record, data.answer_key, allow_numbers=True)
    if data.answer_format == "gsm8k":
        answer = _gsm8k_answer(answer, data.answer_key)
    extra = {key: value for key, value in record.items() if key not in columns.values()}
    images = () if data.images_key is None else _images(record, data.images_key, directory, data.max_image_bytes)
    return RowPrompt(text, prompt, answer, extra, images)


def _value(record: Mapping[str, Any], key: str) -> Any:
    """``record[key]``; BadRow naming the keys present when it is missing."""
    if key not in record:
        raise BadRow(f"missing key {key!r} (keys present: {', '.join(map(repr, record)) or 'none'})")
    return record[key]


def _field(record: Mapping[str, Any], key: str, *, allow_numbers: bool) -> str:
    """``record[key]`` as a string; BadRow when it is missing or of a wrong type."""
    value = _value(record, key)
    if isinstance(value, str):
        return value
    if allow_numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    kind = "a string or a number" if allow_numbers else "a string"
    raise BadRow(f"key {key!r} must be {kind}, got {type(value).__name__}")


def _chat(record: Mapping[str, Any], key: str) -> Chat:
    """``record[key]`` as chat messages; BadRow unless it is a non-empty list of ``{role, content}`` mappings with
    known roles and string contents, whose last message is not the assistant's (the model answers after it)."""
    messages = _value(record, key)
    if not isinstance(messages, list) or not messages:
        raise BadRow(f"key {key!r} must be a non-empty list of {{role, content}} messages, got {messages!r:.80}")
    chat = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if role not in ROLES or not isinstance(content, str):
            raise BadRow(
                f"key {key!r}: message {i} must be {{role, content}} with a role of {', '.join(ROLES)} and a string "
                f"content, got {message!r:.80}"
            )
        chat.append((role, content))
    if chat[-1][0] == "assistant":
        raise BadRow(f"key {key!r}: the last message is the assistant's; a prompt ends before the model's answer")
    return tuple(chat)


def _images(record: Mapping[str, Any], key: str, directory: Path, max_bytes: int) -> tuple[bytes, ...]:
    """The encoded bytes of each image ``record[key]`` lists; BadRow when it is no list or an image cannot be read or
    is over ``max_bytes``."""
    entries = _value(record, key)
    if not isinstance(entries, list):
        raise BadRow(f"key {key!r} must be a list of images (paths or data: URIs), got {type(entries).__name__}")
    return tuple(
        _image_bytes(entry, f"key {key!r}: image {i}", directory, max_bytes) for i, entry in enumerate(entries)
    )


def _image_bytes(entry: Any, where: str, directory: Path, max_bytes: int) -> bytes:
    """One image's encoded bytes: from a ``data:...;base64,`` URI, or the file at a path; BadRow naming ``where``."""
    if isinstance(entry, Mapping):  # datasets' Image value: its bytes when it holds them, else its path
        entry = entry.get("bytes") or entry.get("path")
    if not isinstance(entry, str) or not entry:
        raise BadRow(f"{where} must be a file path or a data: URI, got {entry!r:.80}")
    too_big = f"more than data.max_image_bytes={max_bytes}; shrink the image or raise data.max_image_bytes"
    if not entry.startswith("data:"):
        path = directory / entry
        try:
            size = path.stat().st_size
            if size > max_bytes:
                raise BadRow(f"{where} ({path}) is {size} bytes, {too_big}")
            return path.read_bytes()
        except OSError as err:
            raise BadRow(f"{where}: cannot read {path}: {err.strerror or err}") from None
    header, comma, payload = entry.partition(",")
    if not comma or not header.endswith(";base64"):
        raise BadRow(f"{where} is a data: URI without ';base64,' before its data")
    if len(payload) // 4 * 3 > max_bytes + 2:  # base64 is 4 characters per 3 bytes: refuse before decoding
        raise BadRow(f"{where} holds about {len(payload) // 4 * 3} bytes, {too_big}")
    try:
        data = base64.b64decode(payload, validate=True)
    except binascii.Error as err:
        raise BadRow(f"{where} is not valid base64: {err}") from None
    if len(data) > max_bytes:
        raise BadRow(f"{where} holds {len(data)} bytes, {too_big}")
    return data


def _gsm8k_answer(answer: str, key: str) -> str:
    """The final answer of a GSM8K worked solution: what follows its last ``####``, stripped, commas dropped."""
    _, marker, final = answer.rpartition(GSM8K_MARKER)
    final = final.strip().replace(",", "")
    if not marker or not final:
        raise BadRow(
            f"key {key!r} has no final answer after a {GSM8K_MARKER!r} (data.answer_format: gsm8k), got {answer!r:.80}"
        )
    return final
