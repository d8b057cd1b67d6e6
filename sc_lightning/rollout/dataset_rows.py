"""A dataset file's row as a prompt's parts: which columns hold them and how the answer is written (docs/datasets.md).

``data.prompt_key`` names the column of a prompt's text, or ``data.messages_key`` the column of a prompt given as
chat messages (a list of ``{role, content}``); ``data.answer_key`` names the column of the reference answer, which
``data.answer_format`` reads: ``plain`` takes it whole, ``gsm8k`` takes what follows its last ``####``, as GSM8K's
worked solutions end (``... so she has 5 + 3 = 8 apples.\\n#### 8``). A file whose schema lacks a column is refused
at once (:func:`column_issues`); a row that lacks one, or holds the wrong type, is a :class:`BadRow`.
"""

from __future__ import annotations

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


def required_columns(data: DataConfig) -> dict[str, str]:
    """The columns a row needs, by the knob that names each."""
    if data.messages_key is not None:
        return {"data.messages_key": data.messages_key, "data.answer_key": data.answer_key}
    return {"data.prompt_key": data.prompt_key, "data.answer_key": data.answer_key}


def column_issues(data: DataConfig, columns: Collection[str], path: Path) -> list[ConfigIssue]:
    """One issue per required column missing from ``columns`` (the file's schema), naming the knob, the file and the
    columns it has."""
    listed = ", ".join(columns) or "none"
    return [
        ConfigIssue(knob, f"{key!r} is not a column of {path} (columns: {listed}); set {knob} to one of them")
        for knob, key in required_columns(data).items()
        if key not in columns
    ]


def read_row(record: Mapping[str, Any], data: DataConfig) -> RowPrompt:
    """The prompt's parts in ``record`` as the key knobs map them; BadRow naming the reason when it cannot be used."""
    columns = required_columns(data)
    if data.messages_key is None:
        text = _field(record, data.prompt_key, allow_numbers=False)
        if not text:
            raise BadRow(f"key {data.prompt_key!r} is an empty string")
        prompt: str | Chat = text
    else:
        prompt = _chat(record, data.messages_key)
        text = prompt[-1][1]
    answer = _field(record, data.answer_key, allow_numbers=True)
    if data.answer_format == "gsm8k":
        answer = _gsm8k_answer(answer, data.answer_key)
    extra = {key: value for key, value in record.items() if key not in columns.values()}
    return RowPrompt(text, prompt, answer, extra)


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


def _gsm8k_answer(answer: str, key: str) -> str:
    """The final answer of a GSM8K worked solution: what follows its last ``####``, stripped, commas dropped."""
    _, marker, final = answer.rpartition(GSM8K_MARKER)
    final = final.strip().replace(",", "")
    if not marker or not final:
        raise BadRow(
            f"key {key!r} has no final answer after a {GSM8K_MARKER!r} (data.answer_format: gsm8k), got {answer!r:.80}"
        )
    return final
