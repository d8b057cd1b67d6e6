"""Prompts from a dataset file: a JSONL file, a Parquet file or a saved ``datasets`` directory, its columns mapped by
``data``'s key knobs, its bad rows skipped within ``data.max_skipped_rows`` (docs/datasets.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from sc_lightning.config.knobs import ConfigIssue
from sc_lightning.config.runtime import DATASET_FILES, DataConfig
from sc_lightning.rollout.dataset_base import (
    BUILTIN_NAMES,
    LISTED_BAD_ROWS,
    AnswerCheck,
    DatasetError,
    ListDataset,
    prompt_length_problem,
)
from sc_lightning.rollout.dataset_files import BadRow, DatasetFileError, Record, RecordFile, open_records
from sc_lightning.rollout.dataset_rows import Chat, RowPrompt, column_issues, read_row
from sc_lightning.rollout.images import ImageFormat, decode_image, image_prompt_ids
from sc_lightning.tokenizer import Tokenizer, prompt_token_ids
from sc_lightning.types import Prompt, PromptImage

log = logging.getLogger(__name__)


class FilePromptDataset(ListDataset):
    """Prompts read from a dataset file: a JSONL file, a Parquet file, or a directory written by ``datasets``'
    save_to_disk (:mod:`~sc_lightning.rollout.dataset_files`), its columns mapped by ``data``'s key knobs
    (:mod:`~sc_lightning.rollout.dataset_rows`; docs/datasets.md).

    A file whose schema lacks a column the knobs name fails at once, naming the knob, the key and the file. A bad
    row — not UTF-8, not JSON, not an object (JSONL), a key missing or of a wrong type, an answer ``check_answer`` (the
    environment's, see :func:`~sc_lightning.rollout.envs.base.answer_check`) refuses, a prompt the tokenizer cannot
    represent, or longer than ``data.max_prompt_length`` tokens — is skipped when the file holds at most
    ``data.max_skipped_rows`` of them (each logged as a warning with its place, ``file:line`` or ``path[row]``, and
    reason, and listed in :attr:`skipped_rows`); one more and loading fails with a DatasetError that lists the first
    few. Prompt ``i`` (counting kept rows) has id ``{task}-{i:06d}`` and index ``i``. A text prompt's token ids are
    bos and the encoded text, or with ``data.apply_chat_template`` the text rendered as a user message by the
    tokenizer's chat template (``text`` stays the raw text); a chat prompt (``data.messages_key``) is always rendered
    by the template, and its ``text`` is its last message's content. The row's other columns go to ``Prompt.extra``.

    With ``images`` (a vision-language policy's format) every row needs ``data.images_key``: its images are decoded
    and resized once here, and placed in the token ids (:func:`~sc_lightning.rollout.images.image_prompt_ids`); a row
    without an image, or with one that cannot be read or decoded or is over ``data.max_image_bytes``, is a bad row.
    """

    skipped_rows: list[tuple[str, str]]
    """``(where, reason)`` of every bad row skipped, in file order."""

    def __init__(
        self,
        path: str | Path,
        tokenizer: Tokenizer,
        data: DataConfig | None = None,
        task: str = "math",
        *,
        check_answer: AnswerCheck | None = None,
        knob: str = "data.dataset_name",
        images: ImageFormat | None = None,
    ) -> None:
        data = data or DataConfig()
        self.path = Path(path)
        self.task = task
        check_image_knobs(data, images)
        records = open_prompt_file(self.path, data, knob)
        encode = prompt_encoder(tokenizer, data)
        self.tokenizer, self.images = tokenizer, images
        self._prompts = []
        self.skipped_rows = []
        try:
            for where, record in records.records():
                try:
                    prompt = self._prompt(record, data, encode, check_answer)
                except BadRow as bad:
                    self.skipped_rows.append((where, str(bad)))
                else:
                    self._prompts.append(prompt)
        except DatasetFileError as err:
            raise DatasetError(f"cannot read the prompt file {self.path}: {err}") from err
        self._enforce_skip_budget(data.max_skipped_rows)

    def _prompt(self, record: Record, data: DataConfig, encode: Encode, check_answer: AnswerCheck | None) -> Prompt:
        """The next prompt, from ``record``; BadRow naming the reason when the row cannot be used."""
        if isinstance(record, BadRow):
            raise record
        row = read_row(record, data, self.path.parent)
        if check_answer is not None:
            try:
                check_answer(row.answer)
            except ValueError as err:  # the environment's RewardError
                raise BadRow(f"key {data.answer_key!r}: {err}") from None
        images = self._decode_images(row, data)
        try:
            if self.images is None:
                token_ids = encode(row.prompt)
            else:
                token_ids = image_prompt_ids(self.tokenizer, row.text, len(images), self.images)
        except ValueError as err:
            raise BadRow(f"cannot tokenize the prompt: {err}") from None
        too_long = prompt_length_problem(token_ids, data.max_prompt_length)
        if too_long:
            raise BadRow(f"the prompt {too_long}")
        i, task = len(self._prompts), self.task
        return Prompt(
            f"{task}-{i:06d}",
            token_ids,
            text=row.text,
            answer=row.answer,
            task=task,
            extra=row.extra,
            index=i,
            images=images,
        )

    def _decode_images(self, row: RowPrompt, data: DataConfig) -> tuple[PromptImage, ...]:
        """The row's images decoded at the policy's image size (none for a text policy); BadRow when a
        vision-language policy's row has none, or one cannot be decoded."""
        if self.images is None:
            return ()
        if not row.images:
            raise BadRow(f"key {data.images_key!r} lists no image; a vision-language policy trains on images")
        try:
            return tuple(decode_image(encoded, self.images.image_size) for encoded in row.images)
        except ValueError as err:
            raise BadRow(f"key {data.images_key!r}: {err}") from None

    def _enforce_skip_budget(self, max_skipped_rows: int) -> None:
        """Log the skipped rows when they fit ``max_skipped_rows``; else a DatasetError listing the first few."""
        skipped = self.skipped_rows
        if len(skipped) > max_skipped_rows:
            listed = "\n".join(f"  - {where}: {reason}" for where, reason in skipped[:LISTED_BAD_ROWS])
            more = f"\n  ... and {len(skipped) - LISTED_BAD_ROWS} more" if len(skipped) > LISTED_BAD_ROWS else ""
            raise DatasetError(
                f"the prompt file {self.path} has {len(skipped)} bad row(s), more than "
                f"data.max_skipped_rows={max_skipped_rows} allows; fix them, or raise data.max_skipped_rows to skip "
                f"them (each skip is logged):\n{listed}{more}"
            )
        for where, reason in skipped:
            log.warning("skipped dataset row %s: %s", where, reason)
        if skipped:
            log.warning(
                "skipped %d bad row(s) of %s (data.max_skipped_rows=%d); %d prompts kept",
                len(skipped),
                self.path,
                max_skipped_rows,
                len(self._prompts),
            )
        if not self._prompts:
            skipped_all = f" (all {len(skipped)} rows were bad and skipped)" if skipped else ""
            raise DatasetError(f"the prompt file {self.path} holds no records{skipped_all}")


def check_image_knobs(data: DataConfig, images: ImageFormat | None) -> None:
    """DatasetError when the prompts' images and the policy disagree (the config rules of
    :mod:`sc_lightning.config.rules.vlm` say so at start): images for a text policy, none for a vision-language one,
    or images with chat rendering."""
    if (images is None) != (data.images_key is None):
        raise DatasetError(
            f"data.images_key is {data.images_key!r} but policy.is_vlm is {images is not None}: set both, or neither"
        )
    if images is not None and (data.messages_key is not None or data.apply_chat_template):
        raise DatasetError(
            "prompts with images are not chat-rendered yet: unset data.messages_key, apply_chat_template"
        )


def prompt_file_issues(name: str | Path, data: DataConfig, knob: str) -> tuple[RecordFile | None, list[ConfigIssue]]:
    """The reader of the dataset file ``name`` (the value of ``knob``) and every reason it cannot give ``data``'s
    prompts: it is no dataset file this package reads, or its schema lacks a column the key knobs name (a JSONL file
    has no schema: its rows are checked one by one as it loads). No rows are read."""
    try:
        records = open_records(name)
    except DatasetFileError as err:
        builtins = ", ".join(BUILTIN_NAMES[knob])
        fix = f"give a built-in name ({builtins}) or the path of {DATASET_FILES}"
        return None, [ConfigIssue(knob, f"is {str(name)!r}: {err}; {fix}")]
    columns = records.columns
    return records, [] if columns is None else column_issues(data, columns, Path(name))


def open_prompt_file(name: str | Path, data: DataConfig, knob: str) -> RecordFile:
    """The reader of the dataset file ``name`` (the value of ``knob``); DatasetError listing
    :func:`prompt_file_issues` when there is any."""
    records, issues = prompt_file_issues(name, data, knob)
    if records is None or issues:
        raise DatasetError("; ".join(map(str, issues)))
    return records


Encode = Callable[[str | Chat], tuple[int, ...]]
"""A prompt's token ids, from its text or its chat messages."""


def prompt_encoder(tokenizer: Tokenizer, data: DataConfig) -> Encode:
    """A prompt's token ids: a text is bos and the text, or with ``data.apply_chat_template`` a user message (after
    ``data.system_prompt`` as a system message, when set) rendered by ``tokenizer``'s chat template; chat messages
    (``data.messages_key``) are always rendered by that template, as they are (the generation prompt added).
    DatasetError when the template is needed and the tokenizer has none."""
    if data.messages_key is not None:
        needs = f"data.messages_key is {data.messages_key!r}"
    elif data.apply_chat_template:
        needs = "data.apply_chat_template is true"
    else:
        return lambda prompt: prompt_token_ids(tokenizer, str(prompt))  # a text: no chat without messages_key
    from sc_lightning.rollout.multiturn.chat import Message, chat_template_for  # the heavier package

    try:
        template = chat_template_for(tokenizer)
    except ValueError as err:
        raise DatasetError(f"{needs}, but {err}") from err

    system = [Message("system", data.system_prompt)] if data.system_prompt is not None else []

    def encode(prompt: str | Chat) -> tuple[int, ...]:
        """A text as a user message (after the system prompt), or the chat's messages, rendered with the generation
        prompt."""
        if isinstance(prompt, str):
            messages = [*system, Message("user", prompt)]
        else:
            messages = [Message(role, content) for role, content in prompt]
        return tuple(template.render(messages, add_generation_prompt=True))

    return encode
