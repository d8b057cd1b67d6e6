"""Prompt datasets: the synthetic arithmetic set, local JSONL files, and ``build_dataset`` that picks one."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sc_lightning.tokenizer import Tokenizer, UnrepresentableTextError, prompt_token_ids
from sc_lightning.types import Prompt

if TYPE_CHECKING:
    from sc_lightning.config.runtime import DataConfig

ARITHMETIC_DATASET_SIZE = 512
BUILTIN_DATASETS = ("arithmetic", "calculator")
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
        "policy.tokenizer_name (or policy.model_name) to one that can, or use a .jsonl dataset"
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


class JsonlPromptDataset(_ListDataset):
    """Prompts read from a local JSONL file: one JSON object per line, blank lines skipped.

    Each object needs ``prompt_key`` (a non-empty string) and ``answer_key`` (a string or a number); any other
    fields go to ``Prompt.extra``. A bad row — not UTF-8, not JSON, not an object, a key missing or of a wrong type,
    an answer ``check_answer`` (the environment's, see :func:`~sc_lightning.rollout.envs.base.answer_check`) refuses,
    a prompt the tokenizer cannot represent, or longer than ``max_prompt_length`` tokens — is skipped when the file
    holds at most ``max_skipped_rows`` of them (each logged as a warning with its ``file:line`` and reason, and listed
    in :attr:`skipped_rows`); one more and loading fails with a DatasetError that lists the first few. Prompt ``i``
    (counting kept records, not lines) has id ``{task}-{i:06d}`` and index ``i``. With ``apply_chat_template`` a
    prompt's token ids are its text rendered as a user message by the tokenizer's chat template (``text`` stays the
    raw text); otherwise bos and the encoded text.
    """

    skipped_rows: list[tuple[str, str]]
    """``(file:line, reason)`` of every bad row skipped, in file order."""

    def __init__(
        self,
        path: str | Path,
        tokenizer: Tokenizer,
        prompt_key: str = "problem",
        answer_key: str = "expected_answer",
        task: str = "math",
        *,
        max_prompt_length: int | None = None,
        max_skipped_rows: int = 0,
        apply_chat_template: bool = False,
        check_answer: AnswerCheck | None = None,
    ) -> None:
        self.path = Path(path)
        encode = prompt_encoder(tokenizer, apply_chat_template)
        self.task = task
        try:
            lines = self.path.read_bytes().splitlines()
        except OSError as err:
            raise DatasetError(f"cannot read the prompt file {self.path}: {err}") from err
        self._prompts = []
        self.skipped_rows = []
        keys = (prompt_key, answer_key)
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                text, answer, token_ids, extra = _parse_row(line, lineno, encode, keys, max_prompt_length, check_answer)
            except _BadRow as bad:
                self.skipped_rows.append((f"{self.path}:{lineno}", str(bad)))
                continue
            i = len(self._prompts)
            self._prompts.append(
                Prompt(f"{task}-{i:06d}", token_ids, text=text, answer=answer, task=task, extra=extra, index=i)
            )
        self._enforce_skip_budget(max_skipped_rows)

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


def prompt_encoder(tokenizer: Tokenizer, apply_chat_template: bool) -> Callable[[str], tuple[int, ...]]:
    """A prompt text's token ids: as a user message rendered by ``tokenizer``'s chat template, or bos and the text."""
    if not apply_chat_template:
        return lambda text: prompt_token_ids(tokenizer, text)
    from sc_lightning.rollout.multiturn.chat import chat_template_for, user_prompt_ids  # the heavier package

    try:
        template = chat_template_for(tokenizer)
    except ValueError as err:
        raise DatasetError(f"data.apply_chat_template is true, but {err}") from err
    return lambda text: user_prompt_ids(template, text)


class _BadRow(ValueError):
    """One dataset row cannot be used; the message is the reason (the caller adds ``file:line``)."""


def _parse_row(
    line: bytes,
    lineno: int,
    encode: Callable[[str], tuple[int, ...]],
    keys: tuple[str, str],
    max_prompt_length: int | None,
    check_answer: AnswerCheck | None,
) -> tuple[str, str, tuple[int, ...], Mapping[str, Any]]:
    """``(text, answer, token_ids, extra)`` of one JSONL row; _BadRow naming the reason when it cannot be used."""
    prompt_key, answer_key = keys
    try:
        decoded = line.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a byte-order mark may open the file
    except UnicodeDecodeError as err:
        raise _BadRow(f"not valid UTF-8: {err}") from None
    try:
        record = json.loads(decoded)
    except json.JSONDecodeError as err:
        raise _BadRow(f"not valid JSON: {err}") from None
    if not isinstance(record, dict):
        raise _BadRow(f"expected a JSON object, got {type(record).__name__}")
    text = _field(record, prompt_key, allow_numbers=False)
    if not text:
        raise _BadRow(f"key {prompt_key!r} is an empty string")
    answer = _field(record, answer_key, allow_numbers=True)
    if check_answer is not None:
        try:
            check_answer(answer)
        except ValueError as err:  # the environment's RewardError
            raise _BadRow(f"key {answer_key!r}: {err}") from None
    try:
        token_ids = encode(text)
    except ValueError as err:
        raise _BadRow(f"cannot tokenize the prompt: {err}") from None
    too_long = prompt_length_problem(token_ids, max_prompt_length)
    if too_long:
        raise _BadRow(f"the prompt {too_long}")
    return text, answer, token_ids, {k: v for k, v in record.items() if k not in keys}


def _field(record: dict[str, Any], key: str, *, allow_numbers: bool) -> str:
    """``record[key]`` as a string; _BadRow when it is missing or of a wrong type."""
    if key not in record:
        raise _BadRow(f"missing key {key!r} (keys present: {', '.join(map(repr, record)) or 'none'})")
    value = record[key]
    if isinstance(value, str):
        return value
    if allow_numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    kind = "a string or a number" if allow_numbers else "a string"
    raise _BadRow(f"key {key!r} must be {kind}, got {type(value).__name__}")


def build_dataset(
    cfg: DataConfig, tokenizer: Tokenizer, *, seed: int, check_answer: AnswerCheck | None = None
) -> PromptDataset:
    """The dataset named by ``cfg.dataset_name``: ``"arithmetic"`` or ``"calculator"`` (512 prompts from ``seed``)
    or a ``.jsonl`` path.

    Every prompt is checked against ``cfg.max_prompt_length`` and the tokenizer here, and every JSONL answer against
    ``check_answer``, so a bad prompt fails at load time; a JSONL file may have up to ``cfg.max_skipped_rows`` bad
    rows, which are skipped (and logged).
    """
    name = cfg.dataset_name
    if name == "arithmetic":
        return ArithmeticDataset(ARITHMETIC_DATASET_SIZE, seed, tokenizer, max_prompt_length=cfg.max_prompt_length)
    if name == "calculator":
        return CalculatorDataset(ARITHMETIC_DATASET_SIZE, seed, tokenizer, max_prompt_length=cfg.max_prompt_length)
    if name.endswith(".jsonl"):
        return JsonlPromptDataset(
            name,
            tokenizer,
            max_prompt_length=cfg.max_prompt_length,
            max_skipped_rows=cfg.max_skipped_rows,
            apply_chat_template=cfg.apply_chat_template,
            check_answer=check_answer,
        )
    raise DatasetError(
        f"unknown dataset {name!r} (data.dataset_name); known: {', '.join(BUILTIN_DATASETS)}, "
        f"or a path to a local .jsonl file"
    )


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


def build_validation_set(
    cfg: DataConfig, tokenizer: Tokenizer, *, max_samples: int | None, check_answer: AnswerCheck | None = None
) -> list[Prompt]:
    """The validation prompts: ``cfg.val_dataset_name`` (``arithmetic-val`` or a ``.jsonl`` path, its answers
    checked by ``check_answer``; None = the arithmetic task's own set), the first ``max_samples`` of them (None =
    all)."""
    name = cfg.val_dataset_name or ("arithmetic-val" if cfg.dataset_name == "arithmetic" else None)
    if name == "arithmetic-val":
        dataset: PromptDataset = ArithmeticValidationSet(tokenizer, max_prompt_length=cfg.max_prompt_length)
    elif name is not None and name.endswith(".jsonl"):
        dataset = JsonlPromptDataset(
            name,
            tokenizer,
            max_prompt_length=cfg.max_prompt_length,
            max_skipped_rows=cfg.max_skipped_rows,
            apply_chat_template=cfg.apply_chat_template,
            check_answer=check_answer,
        )
    else:
        raise DatasetError(
            f"unknown validation set {name!r} (data.val_dataset_name); known: arithmetic-val, or a local .jsonl path"
        )
    count = len(dataset) if max_samples is None else min(max_samples, len(dataset))
    return [dataset[i] for i in range(count)]
