"""``train_data.jsonl``: which rows each optimizer step trained, one JSON object per row, rolled back on resume.

Each line: ``step`` (the RL step, 0-based: the trainer's ``global_step`` before that step's optimizer step),
``prompt_index`` (the prompt's position in its dataset), ``prompt_id``, ``group_id``, ``generation_index``,
``start_weight``, ``end_weight``, ``target_step`` and ``reward`` (and ``teacher``, an on-policy distillation row's
teacher alias). With dynamic sampling (``grpo.use_dynamic_sampling``)
a group filtered before its commit — consumed, never trained — gets one line of its own, under the step it was
filtered for: ``step``, ``prompt_index``, ``prompt_id``, ``group_id``, ``filtered`` (the reason,
``zero_reward_variance``) and ``rewards`` (its N rewards); readers of trained rows skip lines with ``filtered``.
Lines are written after the step's optimizer
step, so a step that crashed half way never appears. On (re)start the file keeps only the steps before the one
training resumes at — the steps the restored checkpoint holds — so after any number of crashes and resumes it is
the history of the run that finished.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sc_lightning.controller.api import OPTIONAL_ROW_TAGS, ROW_TAGS

FILENAME = "train_data.jsonl"
FIELDS = (*ROW_TAGS, "reward")
"""What each line records of a row (besides ``step``): its tags, with ``weight_version`` written as ``start_weight``."""


class TrainDataLog:
    """Appends one line per trained row to ``path``; :meth:`open` rolls the file back to a resume step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: Any = None

    def open(self, resume_step: int) -> None:
        """Keep only lines of steps before ``resume_step`` (all of them go on a fresh run), then append."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if self.path.exists() and resume_step > 0:
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line)["step"] < resume_step:
                        kept.append(line)
                except (ValueError, KeyError):
                    break  # a line torn by a crash: nothing after it was durable either
        temporary = self.path.with_suffix(".jsonl.tmp")
        temporary.write_text("".join(f"{line}\n" for line in kept))
        os.replace(temporary, self.path)
        self._handle = self.path.open("a")

    def write(self, step: int, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append the rows one step trained, then flush them to the operating system."""
        if self._handle is None:
            raise RuntimeError("TrainDataLog.open() was not called")
        for row in rows:
            record = {"step": step, **{name: row.get(name) for name in FIELDS}}
            record |= {name: row[name] for name in OPTIONAL_ROW_TAGS if name in row}
            record["start_weight"] = record.pop("weight_version")
            self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()

    def write_filtered(self, step: int, records: Iterable[Mapping[str, Any]]) -> None:
        """Append one line per prompt group dynamic sampling filtered for ``step``, then flush."""
        if self._handle is None:
            raise RuntimeError("TrainDataLog.open() was not called")
        for record in records:
            self._handle.write(json.dumps({"step": step, **record}) + "\n")
        self._handle.flush()

    def close(self) -> None:
        """Close the file; idempotent."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
