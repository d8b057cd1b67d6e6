"""Prompt datasets: the synthetic arithmetic set, local JSONL files, and ``build_dataset`` that picks one."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sc_lightning.tokenizer import Tokenizer, prompt_token_ids
from sc_lightning.types import Prompt

if TYPE_CHECKING:
    from sc_lightning.config.runtime import DataConfig

ARITHMETIC_DATASET_SIZE = 512
BUILTIN_DATASETS = ("arithmetic",)


class DatasetError(ValueError):
    """A dataset cannot be loaded: unknown name, unreadable file, bad record, or a prompt over the length limit."""


@runtime_checkable
class PromptDataset(Protocol):
    """A finite, indexable collection of prompts."""

    def __len__(self) -> int:
        """Number of prompts."""

    def __getitem__(self, index: int) -> Prompt:
        """The prompt at ``index`` (0 <= index < len)."""


def check_prompt_length(prompt: Prompt, max_prompt_length: int | None, source: str = "") -> None:
    """DatasetError naming the prompt when it has more than ``max_prompt_length`` tokens (None = no limit)."""
    if max_prompt_length is not None and len(prompt.token_ids) > max_prompt_length:
        where = f" in {source}" if source else ""
        raise DatasetError(
            f"prompt {prompt.prompt_id}{where} has {len(prompt.token_ids)} tokens, more than "
            f"data.max_prompt_length={max_prompt_length}"
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
            text = f"{a}+{b}="
            prompt = Prompt(
                prompt_id=f"arithmetic-{i:06d}",
                token_ids=prompt_token_ids(tokenizer, text),
                text=text,
                answer=str(a + b),
                task="arithmetic",
                index=i,
            )
            check_prompt_length(prompt, max_prompt_length, "the arithmetic dataset")
            self._prompts.append(prompt)


class JsonlPromptDataset(_ListDataset):
    """Prompts read from a local JSONL file: one JSON object per line, blank lines skipped.

    Each object needs ``prompt_key`` (a string) and ``answer_key`` (a string or a number); any other fields go to
    ``Prompt.extra``. Prompt ``i`` (counting records, not lines) has id ``{task}-{i:06d}``.
    """

    def __init__(
        self,
        path: str | Path,
        tokenizer: Tokenizer,
        prompt_key: str = "problem",
        answer_key: str = "expected_answer",
        task: str = "math",
        *,
        max_prompt_length: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.task = task
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise DatasetError(f"cannot read the prompt file {self.path}: {err}") from err
        self._prompts = []
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{self.path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{where}: not valid JSON: {err}") from err
            if not isinstance(record, dict):
                raise DatasetError(f"{where}: expected a JSON object, got {type(record).__name__}")
            text = _field(record, prompt_key, where, allow_numbers=False)
            answer = _field(record, answer_key, where, allow_numbers=True)
            prompt_id = f"{task}-{len(self._prompts):06d}"
            try:
                token_ids = prompt_token_ids(tokenizer, text)
            except ValueError as err:
                raise DatasetError(f"{where}: cannot tokenize prompt {prompt_id}: {err}") from err
            extra: Mapping[str, Any] = {k: v for k, v in record.items() if k not in (prompt_key, answer_key)}
            prompt = Prompt(
                prompt_id=prompt_id,
                token_ids=token_ids,
                text=text,
                answer=answer,
                task=task,
                extra=extra,
                index=len(self._prompts),
            )
            check_prompt_length(prompt, max_prompt_length, where)
            self._prompts.append(prompt)
        if not self._prompts:
            raise DatasetError(f"the prompt file {self.path} holds no records")


def _field(record: dict[str, Any], key: str, where: str, *, allow_numbers: bool) -> str:
    """``record[key]`` as a string; DatasetError naming the file and line when it is missing or of a wrong type."""
    if key not in record:
        raise DatasetError(f"{where}: missing key {key!r} (keys present: {', '.join(map(repr, record)) or 'none'})")
    value = record[key]
    if isinstance(value, str):
        return value
    if allow_numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    kind = "a string or a number" if allow_numbers else "a string"
    raise DatasetError(f"{where}: key {key!r} must be {kind}, got {type(value).__name__}")


def build_dataset(cfg: DataConfig, tokenizer: Tokenizer, *, seed: int) -> PromptDataset:
    """The dataset named by ``cfg.dataset_name``: ``"arithmetic"`` (512 prompts from ``seed``) or a ``.jsonl`` path.

    Every prompt is checked against ``cfg.max_prompt_length`` here, so a too-long prompt fails at load time.
    """
    name = cfg.dataset_name
    if name == "arithmetic":
        return ArithmeticDataset(ARITHMETIC_DATASET_SIZE, seed, tokenizer, max_prompt_length=cfg.max_prompt_length)
    if name.endswith(".jsonl"):
        return JsonlPromptDataset(name, tokenizer, max_prompt_length=cfg.max_prompt_length)
    raise DatasetError(
        f"unknown dataset {name!r} (data.dataset_name); known: {', '.join(BUILTIN_DATASETS)}, "
        f"or a path to a local .jsonl file"
    )
