"""Prompt datasets: the synthetic built-in tasks, dataset files (JSONL, Parquet, saved ``datasets``), and
``build_dataset`` that picks one (docs/datasets.md)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from sc_lightning.config.knobs import ConfigIssue
from sc_lightning.config.runtime import BUILTIN_DATASETS, DATASET_FILES, DataConfig
from sc_lightning.rollout.clevr_prompts import clevr_prompts
from sc_lightning.rollout.dataset_files import BadRow, DatasetFileError, Record, RecordFile, open_records
from sc_lightning.rollout.dataset_rows import Chat, RowPrompt, column_issues, read_row
from sc_lightning.rollout.images import ImageFormat, decode_image, image_prompt_ids
from sc_lightning.tasks.worked_arithmetic import draw_problems
from sc_lightning.tokenizer import Tokenizer, UnrepresentableTextError, prompt_token_ids
from sc_lightning.types import Prompt, PromptImage

ARITHMETIC_DATASET_SIZE = 512
WORKED_DATASET_SIZE = 4096  # configs/grpo_1gpu_long.yaml's 80 steps take 2,560 of them: none twice
CLEVR_DATASET_SIZE = 1024
BUILTIN_NAMES = {"data.dataset_name": BUILTIN_DATASETS, "data.val_dataset_name": ("arithmetic-val",)}
"""The built-in datasets each dataset knob may name instead of a path."""
AnswerCheck = Callable[[str | None], object]
"""An environment's ``check_answer``: raises a ValueError (its RewardError) for an answer it could never score."""
LISTED_BAD_ROWS = 5
"""How many bad rows a DatasetError over ``data.max_skipped_rows`` lists (with the total count)."""
log = logging.getLogger(__name__)


class DatasetError(ValueError):
    """A dataset cannot be loaded: unknown name, unreadable file, bad record, or a prompt over the length limit."""


@runtime_checkable
class PromptDataset(Protocol):
    """A finite, indexable collection of prompts."""

    def __len__(self) -> int:
        """Number of prompts."""

    def __getitem__(self, index: int) -> Prompt:
        """The prompt at ``index`` (0 <= index < len)."""


def prompt_length_problem(token_ids: Sequence[int], max_prompt_length: int | None) -> str | None:
    """Why a prompt of ``token_ids`` is too long (``"has N tokens, more than ..."``), or None (None = no limit)."""
    if max_prompt_length is not None and len(token_ids) > max_prompt_length:
        return f"has {len(token_ids)} tokens, more than data.max_prompt_length={max_prompt_length}"
    return None


def check_prompt_length(prompt: Prompt, max_prompt_length: int | None, source: str = "") -> None:
    """DatasetError naming the prompt when it has more than ``max_prompt_length`` tokens (None = no limit)."""
    problem = prompt_length_problem(prompt.token_ids, max_prompt_length)
    if problem:
        where = f" in {source}" if source else ""
        raise DatasetError(f"prompt {prompt.prompt_id}{where} {problem}")


def unspellable_task(task: str, err: UnrepresentableTextError) -> DatasetError:
    """The DatasetError of a built-in ``task`` whose prompts the run's tokenizer cannot represent."""
    return DatasetError(
        f"the built-in {task} dataset (data.dataset_name) needs a tokenizer that can spell its prompts: {err}; set "
        "policy.tokenizer_name (or policy.model_name) to one that can, or use a dataset file"
    )


class _ListDataset:
    """Prompts held in a list (both built-in datasets are small enough to build eagerly)."""

    _prompts: list[Prompt]

    def __len__(self) -> int:
        return len(self._prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self._prompts[index]

    def __iter__(self) -> Iterator[Prompt]:
        return iter(self._prompts)


class ArithmeticDataset(_ListDataset):
    """Deterministic single-digit addition prompts ``"a+b="`` (a, b in 0..9, answer 0..18) drawn from ``seed``.

    Prompt ``i`` has id ``arithmetic-{i:06d}``, text ``"a+b="``, answer ``str(a + b)`` and task ``"arithmetic"``;
    its token ids are the tokenizer's bos (if any) followed by the encoded text (5 tokens with CharTokenizer).
    """

    def __init__(self, size: int, seed: int, tokenizer: Tokenizer, *, max_prompt_length: int | None = None) -> None:
        if size < 1:
            raise DatasetError(f"the arithmetic dataset needs size >= 1, got {size}")
        self.size = size
        self.seed = seed
        rng = random.Random(f"arithmetic:{seed}")
        self._prompts = []
        for i in range(size):
            a, b = rng.randrange(10), rng.randrange(10)
            prompt = arithmetic_prompt(tokenizer, a, b, prompt_id=f"arithmetic-{i:06d}", index=i)
            check_prompt_length(prompt, max_prompt_length, "the arithmetic dataset")
            self._prompts.append(prompt)


def arithmetic_prompt(tokenizer: Tokenizer, a: int, b: int, *, prompt_id: str, index: int) -> Prompt:
    """The arithmetic task's prompt ``"a+b="`` (answer ``a + b``); DatasetError when the tokenizer cannot spell it."""
    text = f"{a}+{b}="
    try:
        token_ids = prompt_token_ids(tokenizer, text)
    except UnrepresentableTextError as err:
        raise unspellable_task("arithmetic", err) from None
    return Prompt(
        prompt_id=prompt_id,
        token_ids=token_ids,
        text=text,
        answer=str(a + b),
        task="arithmetic",
        index=index,
    )


class CalculatorDataset(_ListDataset):
    """Two-digit products ``"a*b"`` for the multi-turn calculator environment, rendered by the tokenizer's chat
    template (see :func:`sc_lightning.rollout.multiturn.calculator.calculator_prompts`)."""

    def __init__(self, size: int, seed: int, tokenizer: Tokenizer, *, max_prompt_length: int | None = None) -> None:
        from sc_lightning.rollout.multiturn.calculator import calculator_prompts  # the multi-turn package is heavier

        try:
            self._prompts = calculator_prompts(size, seed, tokenizer)
        except UnrepresentableTextError as err:
            raise unspellable_task("calculator", err) from None
        for prompt in self._prompts:
            check_prompt_length(prompt, max_prompt_length, "the calculator dataset")


class WorkedArithmeticDataset(_ListDataset):
    """Worked-arithmetic problems ``"0023-7="`` drawn from ``seed`` (:mod:`sc_lightning.tasks.worked_arithmetic`):
    answers worked in 65 to 2,045 tokens with a long tail, the last line ``a mod b``.

    Prompt ``i`` has id ``worked_arithmetic-{i:06d}``, text ``"0023-7="``, answer ``"2"`` and task
    ``"worked_arithmetic"``; its token ids are the tokenizer's bos (if any) and the text (8 tokens with CharTokenizer).
    """

    def __init__(self, size: int, seed: int, tokenizer: Tokenizer, *, max_prompt_length: int | None = None) -> None:
        self._prompts = []
        for i, problem in enumerate(draw_problems(size, seed)):
            try:
                token_ids = prompt_token_ids(tokenizer, problem.prompt)
            except UnrepresentableTextError as err:
                raise unspellable_task("worked_arithmetic", err) from None
            prompt = Prompt(
                f"worked_arithmetic-{i:06d}",
                token_ids,
                text=problem.prompt,
                answer=problem.answer,
                task="worked_arithmetic",
                index=i,
            )
            check_prompt_length(prompt, max_prompt_length, "the worked_arithmetic dataset")
            self._prompts.append(prompt)


class ClevrDataset(_ListDataset):
    """Questions about rendered scenes of coloured shapes drawn from ``seed``, for a vision-language policy whose
    image format is ``images`` (:func:`~sc_lightning.rollout.clevr_prompts.clevr_prompts`); DatasetError naming
    ``policy.is_vlm`` when ``images`` is None (a text policy cannot see the scenes)."""

    def __init__(
        self, size: int, seed: int, tokenizer: Tokenizer, images: ImageFormat | None, *, max_prompt_length: int | None
    ) -> None:
        if images is None:
            raise DatasetError(
                "the built-in clevr dataset (data.dataset_name) asks about images, which a text policy cannot see; "
                "set policy.is_vlm: true with a vision-language policy (policy.model_name)"
            )
        try:
            self._prompts = clevr_prompts(size, seed, tokenizer, images)
        except UnrepresentableTextError as err:
            raise unspellable_task("clevr", err) from None
        for prompt in self._prompts:
            check_prompt_length(prompt, max_prompt_length, "the clevr dataset")


class FilePromptDataset(_ListDataset):
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


def build_dataset(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    *,
    seed: int,
    check_answer: AnswerCheck | None = None,
    images: ImageFormat | None = None,
) -> PromptDataset:
    """The dataset named by ``cfg.dataset_name``: ``"arithmetic"`` or ``"calculator"`` (512 prompts from ``seed``),
    ``"worked_arithmetic"`` (4,096), ``"clevr"`` (1,024, for a vision-language policy whose image format is
    ``images``) or the path of a dataset file (:class:`FilePromptDataset`, its images in ``images``' format).

    Every prompt is checked against ``cfg.max_prompt_length`` and the tokenizer here, and every file's answer against
    ``check_answer``, so a bad prompt fails at load time; a file may have up to ``cfg.max_skipped_rows`` bad rows,
    which are skipped (and logged).
    """
    name = cfg.dataset_name
    if name == "arithmetic":
        return ArithmeticDataset(ARITHMETIC_DATASET_SIZE, seed, tokenizer, max_prompt_length=cfg.max_prompt_length)
    if name == "calculator":
        return CalculatorDataset(ARITHMETIC_DATASET_SIZE, seed, tokenizer, max_prompt_length=cfg.max_prompt_length)
    if name == "worked_arithmetic":
        return WorkedArithmeticDataset(WORKED_DATASET_SIZE, seed, tokenizer, max_prompt_length=cfg.max_prompt_length)
    if name == "clevr":
        return ClevrDataset(CLEVR_DATASET_SIZE, seed, tokenizer, images, max_prompt_length=cfg.max_prompt_length)
    return FilePromptDataset(name, tokenizer, cfg, check_answer=check_answer, images=images)


class ArithmeticValidationSet(_ListDataset):
    """Every distinct ``"a+b="`` problem of the arithmetic task (a, b in 0..9) once: 100 prompts, in a fixed order.

    The training set draws its 512 prompts from the same 100 problems, so held-out *problems* cannot exist; what
    is held out is the prompts themselves (ids ``arithmetic-val-{a}{b}``, never in the training stream), and each
    problem counts once, so ``val/accuracy`` is the share of the whole task solved. The order is a fixed shuffle,
    so ``max_val_samples: N`` keeps a spread of N problems.
    """

    def __init__(self, tokenizer: Tokenizer, *, max_prompt_length: int | None = None) -> None:
        pairs = [(a, b) for a in range(10) for b in range(10)]
        random.Random("arithmetic-val").shuffle(pairs)
        self._prompts = []
        for i, (a, b) in enumerate(pairs):
            prompt = arithmetic_prompt(tokenizer, a, b, prompt_id=f"arithmetic-val-{a}{b}", index=i)
            check_prompt_length(prompt, max_prompt_length, "the arithmetic validation set")
            self._prompts.append(prompt)


def validation_set_name(cfg: DataConfig) -> str | None:
    """The validation set ``cfg`` names: ``data.val_dataset_name``, else the arithmetic task's own
    ``arithmetic-val``; None when it has none."""
    return cfg.val_dataset_name or ("arithmetic-val" if cfg.dataset_name == "arithmetic" else None)


def build_validation_set(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    *,
    max_samples: int | None,
    check_answer: AnswerCheck | None = None,
    images: ImageFormat | None = None,
) -> list[Prompt]:
    """The validation prompts: ``cfg.val_dataset_name`` (``arithmetic-val`` or a dataset file's path, its answers
    checked by ``check_answer``, its images in ``images``' format; None = the arithmetic task's own set), the first
    ``max_samples`` of them (None = all)."""
    name = validation_set_name(cfg)
    if name == "arithmetic-val":
        dataset: PromptDataset = ArithmeticValidationSet(tokenizer, max_prompt_length=cfg.max_prompt_length)
    elif name is not None:
        dataset = FilePromptDataset(
            name, tokenizer, cfg, check_answer=check_answer, knob="data.val_dataset_name", images=images
        )
    else:
        raise DatasetError(
            "data.val_dataset_name is null and data.dataset_name is no built-in task with a validation set; "
            f"give the path of {DATASET_FILES}"
        )
    count = len(dataset) if max_samples is None else min(max_samples, len(dataset))
    return [dataset[i] for i in range(count)]
