"""What ``generate`` reads and writes around one pass of :func:`~sc_lightning.rollout.answers.answer_prompts`: the
prompts of a split, one JSONL row per answer, and the summary it prints (docs/evaluation.md).

The split: ``val`` is the validation set (``data.val_dataset_name``, or the arithmetic task's ``arithmetic-val``),
``train`` the training set (``data.dataset_name``), each read as a run reads it (same key knobs, chat template,
answer checks and bad-row budget) and taken in file order, without the training stream's shuffle; without a split,
the validation set when the config has one, else the training set.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_lightning.config.runtime import DataConfig
from sc_lightning.rollout.answers import Answer
from sc_lightning.rollout.dataset_base import AnswerCheck
from sc_lightning.rollout.datasets import build_dataset, build_validation_set, validation_set_name
from sc_lightning.rollout.images import ImageFormat
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import Prompt

SPLITS = ("val", "train")
"""The splits ``generate --split`` takes."""
EXAMPLE_CHARS = 160
"""How much of a prompt or an answer an example line shows (the JSONL rows hold them whole)."""
Row = dict[str, Any]


@dataclass(frozen=True)
class PromptSplit:
    """The prompts of one split: its name (``val`` or ``train``), the dataset they come from, the prompts."""

    name: str
    source: str
    prompts: list[Prompt]


def default_split(data: DataConfig) -> str:
    """``val`` when ``data`` names a validation set, else ``train``."""
    return "val" if validation_set_name(data) is not None else "train"


def split_prompts(
    data: DataConfig,
    tokenizer: Tokenizer,
    *,
    split: str | None,
    seed: int,
    count: int | None,
    check_answer: AnswerCheck | None = None,
    images: ImageFormat | None = None,
) -> PromptSplit:
    """The first ``count`` prompts (None = all) of ``split`` (None = :func:`default_split`), their images in
    ``images``' format (a vision-language policy); a DatasetError when the split's dataset cannot be read, or ``val``
    is asked for and the config has no validation set."""
    name = split or default_split(data)
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; the splits are {', '.join(SPLITS)}")
    if name == "val":
        prompts = build_validation_set(data, tokenizer, max_samples=count, check_answer=check_answer, images=images)
        return PromptSplit(name, str(validation_set_name(data)), prompts)
    dataset = build_dataset(data, tokenizer, seed=seed, check_answer=check_answer, images=images)
    size = len(dataset) if count is None else min(count, len(dataset))
    return PromptSplit(name, str(data.dataset_name), [dataset[i] for i in range(size)])


def answer_row(answer: Answer, extract: Callable[[str], str | None] | None = None) -> Row:
    """One JSONL row: the prompt, the answer's text, the environment's reward and, when the environment can say which
    answer it read (``extract``), ``extracted_answer``; the token counts and the answer's token ids."""
    prompt, generation = answer.prompt, answer.generation
    row: Row = {
        "prompt_id": prompt.prompt_id,
        "prompt": prompt.text,
        "expected_answer": prompt.answer,
        "answer": answer.text,
    }
    if extract is not None:
        row["extracted_answer"] = extract(answer.text)
    row |= {
        "reward": answer.score.reward,
        "finish_reason": generation.finish_reason,
        "weight_version": generation.weight_version,
        "prompt_tokens": len(prompt.token_ids),
        "answer_tokens": len(generation.token_ids),
        "answer_token_ids": list(generation.token_ids),
    }
    return row


def write_rows(path: Path, rows: Sequence[Row]) -> None:
    """Write ``rows`` to ``path`` as JSON Lines (its folder is created; an existing file is replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@dataclass(frozen=True)
class AnswerSummary:
    """A pass's figures: answers, mean reward, correct answers (reward > 0, as ``val/accuracy`` counts them), mean
    and longest answer in tokens, answers cut at ``max_new_tokens``."""

    answers: int
    mean_reward: float
    correct: int
    mean_tokens: float
    max_tokens: int
    cut: int

    @classmethod
    def of(cls, rows: Sequence[Row]) -> AnswerSummary:
        """The summary of some JSONL rows (at least one)."""
        lengths = [row["answer_tokens"] for row in rows]
        return cls(
            answers=len(rows),
            mean_reward=sum(row["reward"] for row in rows) / len(rows),
            correct=sum(row["reward"] > 0 for row in rows),
            mean_tokens=sum(lengths) / len(rows),
            max_tokens=max(lengths),
            cut=sum(row["finish_reason"] == "length" for row in rows),
        )

    def lines(self) -> list[str]:
        """The summary as printed: reward and correct answers, then answer lengths."""
        return [
            f"mean reward {self.mean_reward:.3f}; correct {self.correct}/{self.answers} "
            f"({self.correct / self.answers:.1%}, reward > 0)",
            f"answer length: mean {self.mean_tokens:.1f}, max {self.max_tokens} tokens; "
            f"{self.cut} cut at max_new_tokens",
        ]


def example_lines(rows: Sequence[Row], count: int) -> list[str]:
    """Up to ``count`` examples, as many rewarded as not where the rows allow, in the rows' order."""
    right = [row for row in rows if row["reward"] > 0]
    wrong = [row for row in rows if row["reward"] <= 0]
    take_right = min(len(right), max(count - len(wrong), (count + 1) // 2))
    chosen = {id(row) for row in right[:take_right] + wrong[: count - take_right]}
    return [_example(row) for row in rows if id(row) in chosen]


def _example(row: Row) -> str:
    extracted = f", extracted {row['extracted_answer']!r}" if "extracted_answer" in row else ""
    return (
        f"  [{row['prompt_id']}] {_one_line(row['prompt'])} -> {_one_line(row['answer'])}\n"
        f"      reward {row['reward']:g}{extracted}, expected {row['expected_answer']!r}, {row['answer_tokens']} tokens"
    )


def _one_line(text: str) -> str:
    """``text`` quoted on one line (newlines escaped), cut to :data:`EXAMPLE_CHARS` characters."""
    quoted = json.dumps(text, ensure_ascii=False)
    return quoted if len(quoted) <= EXAMPLE_CHARS else quoted[: EXAMPLE_CHARS - 1] + "…"
