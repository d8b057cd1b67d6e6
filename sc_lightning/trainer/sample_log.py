"""``samples/``: a few prompts of some RL steps with every sampled answer, its reward, and the prompts' images.

For each recorded step, the first ``data.sample_log_prompts`` prompt groups the step trained (in the order the
controller handed them over; fewer when the step holds fewer), read back from the data plane before the refit
releases them (:func:`read_sampled_prompts`): the prompt's text (its row's prompt tokens decoded with the run's
tokenizer, each image shown as one ``<image>``), every generation's answer (the row's tokens after the prompt,
decoded) with its reward and whether it hit ``max_new_tokens``, and the prompt's images.

Which steps (:class:`SampleLog`, a bounded record): every step is recorded into memory, replacing the one before;
a step is written when it is the first one the run records or its 0-based number is a multiple of
``data.sample_log_every_n_steps``, and the step held in memory is written when the fit ends
(:meth:`SampleLog.close`: its last step, whatever stopped it — the step budget, the rollouts running out, a stop
signal). Writing a step removes the previous latest one unless it is the first or a multiple of N, so the directory
holds the first step, every N-th and the latest: at most ``max_num_steps / N + 2`` records. A process killed
(SIGKILL) loses only the step it held; the resumed run goes on recording. On (re)start :meth:`SampleLog.open` keeps
only the records of steps before the one training resumes at — the steps the restored checkpoint holds — as
``train_data.jsonl`` does, and an image no kept record names is removed with them.

Layout under ``trainer.default_root_dir`` (written on the leader rank only)::

    samples/step_000012.json       {"step": 12, "prompts": [{"prompt_id", "prompt_index", "group_id", "start_weight",
                                     "prompt", "images": ["images/<prompt_id>_0.png", ...],
                                     "answers": [{"generation_index", "text", "reward", "truncated"}, ...]}, ...]}
    samples/images/<prompt_id>_<k>.png    the prompt's k-th image (RGB, at the model's input size), written once
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from sc_lightning.controller.api import IMAGE_FIELDS, GroupMeta
from sc_lightning.data_plane.base import DataPlane
from sc_lightning.models.spec import VisionSpec
from sc_lightning.tokenizer import Tokenizer, decode_with_images

SAMPLES_DIR = "samples"
"""The record's directory, under ``trainer.default_root_dir``."""
IMAGES_DIR = "images"
"""Where the prompts' PNG files go, under :data:`SAMPLES_DIR`."""
RECORD = re.compile(r"step_(\d{6,})\.json$")
SAMPLE_FIELDS = ("input_ids", "prompt_lengths", "total_reward", "truncated")
"""The row fields a record reads from the data plane (the first row of each group: ``pixel_values`` besides)."""


@dataclass(frozen=True)
class SampledAnswer:
    """One generation of a recorded prompt: its decoded answer, reward, and whether it hit ``max_new_tokens``."""

    generation_index: int | None
    text: str
    reward: float
    truncated: bool


@dataclass(frozen=True)
class SampledPrompt:
    """One recorded prompt group: the prompt's text and images (uint8 ``(N, H, W, 3)``, or None) and its answers."""

    prompt_id: str
    prompt_index: int | None
    group_id: str
    start_weight: int
    prompt: str
    answers: list[SampledAnswer]
    images: torch.Tensor | None = field(default=None, compare=False)


def read_sampled_prompts(
    data_plane: DataPlane,
    groups: Sequence[GroupMeta],
    tokenizer: Tokenizer,
    vision: VisionSpec | None = None,
) -> list[SampledPrompt]:
    """The trained rows of ``groups`` as :class:`SampledPrompt` records, read from ``data_plane`` (before the refit
    releases them) and decoded with ``tokenizer``; with ``vision`` (a vision-language policy's) each prompt's images
    too, read from its first row (every row of a group holds its prompt's images)."""
    groups = [group for group in groups if group.keys]
    keys = [key for group in groups for key in group.keys]
    if not keys:
        return []
    rows, tags = data_plane.get(keys, SAMPLE_FIELDS), data_plane.tags(keys)
    images: list[torch.Tensor | None] = [None] * len(groups)
    placeholders: dict[str, int] = {}  # each image's run of ids shown as one <image>
    if vision is not None:
        placeholders = {"image_token_id": vision.image_token_id, "tokens_per_image": vision.tokens_per_image}
        images = list(data_plane.get([group.keys[0] for group in groups], IMAGE_FIELDS)[IMAGE_FIELDS[0]])
    prompts, first = [], 0
    for group, pixels in zip(groups, images, strict=True):
        span = range(first, first + len(group.keys))
        ids = [rows["input_ids"][row].tolist() for row in span]
        starts = [int(rows["prompt_lengths"][row].item()) for row in span]
        answers = [
            SampledAnswer(
                tags[row].get("generation_index"),
                tokenizer.decode(row_ids[start:]),
                float(rows["total_reward"][row].item()),
                bool(rows["truncated"][row].item()),
            )
            for row, row_ids, start in zip(span, ids, starts, strict=True)
        ]
        text = decode_with_images(tokenizer, ids[0][: starts[0]], **placeholders)
        index = tags[first].get("prompt_index")
        prompts.append(SampledPrompt(group.prompt_id, index, group.group_id, group.start_weight, text, answers, pixels))
        first = span.stop
    return prompts


def record_path(directory: Path, step: int) -> Path:
    """Where ``step``'s record goes in the ``samples/`` ``directory``."""
    return directory / f"step_{step:06d}.json"


def recorded_steps(directory: Path) -> dict[int, Path]:
    """The records in the ``samples/`` ``directory`` by step, in step order ({} when there is none)."""
    found = []
    if directory.is_dir():
        for path in directory.iterdir():
            if match := RECORD.fullmatch(path.name):
                found.append((int(match.group(1)), path))
    return dict(sorted(found))


def read_record(path: Path) -> dict[str, Any] | None:
    """One step's record as written (see the module's layout), or None when it cannot be read."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("prompts"), list) else None


class SampleLog:
    """The ``samples/`` record of a run: :meth:`open` rolls it back to a resume step, :meth:`record` takes each
    step's sampled prompts, :meth:`close` writes the last one (see the module's docstring for which steps stay)."""

    def __init__(self, directory: Path, *, every_n_steps: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.directory = directory
        self.every_n_steps = every_n_steps
        self._first: int | None = None  # the first step on record
        self._held: tuple[int, list[SampledPrompt]] | None = None  # the latest step, not written yet
        self._opened = False

    def open(self, resume_step: int) -> None:
        """Keep only the records of steps before ``resume_step`` (none on a fresh run) and the images they name."""
        for step, path in recorded_steps(self.directory).items():
            if step >= resume_step:
                path.unlink()
        for torn in self.directory.glob("**/.*.tmp"):  # a write a crash cut short
            torn.unlink()
        self._remove_unnamed_images()
        self._first = next(iter(recorded_steps(self.directory)), None)
        self._held, self._opened = None, True

    def record(self, step: int, prompts: list[SampledPrompt]) -> None:
        """Take ``step``'s sampled prompts: written now when the step is the first on record or a multiple of N,
        else held until a later step replaces them or :meth:`close` writes them."""
        if not self._opened:
            raise RuntimeError("SampleLog.open() was not called")
        if self._first is None or step % self.every_n_steps == 0:
            self._write(step, prompts)
            self._held = None
        else:
            self._held = (step, prompts)

    def close(self) -> None:
        """Write the step held in memory (the fit's last step); idempotent."""
        if self._held is not None:
            self._write(*self._held)
            self._held = None
        self._opened = False

    def _write(self, step: int, prompts: list[SampledPrompt]) -> None:
        """Write ``step``'s images (those not on disk yet) and record, then drop the latest record before it unless
        it is the first or a multiple of N."""
        entries = [self._entry(prompt) for prompt in prompts]
        path = record_path(self.directory, step)
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps({"step": step, "prompts": entries}, indent=1) + "\n")
        os.replace(temporary, path)
        if self._first is None:
            self._first = step
        dropped = False
        for earlier, earlier_path in recorded_steps(self.directory).items():
            if self._first < earlier < step and earlier % self.every_n_steps:
                earlier_path.unlink()
                dropped = True
        if dropped:
            self._remove_unnamed_images()

    def _entry(self, prompt: SampledPrompt) -> dict[str, Any]:
        """``prompt`` as its record's JSON object, its images written as PNG files (once per prompt id)."""
        names = []
        if prompt.images is not None:
            for k, image in enumerate(prompt.images):
                name = f"{IMAGES_DIR}/{re.sub(r'[^A-Za-z0-9._-]', '_', prompt.prompt_id)}_{k}.png"
                if not (self.directory / name).exists():
                    _write_png(self.directory / name, image)
                names.append(name)
        return {
            "prompt_id": prompt.prompt_id,
            "prompt_index": prompt.prompt_index,
            "group_id": prompt.group_id,
            "start_weight": prompt.start_weight,
            "prompt": prompt.prompt,
            "images": names,
            "answers": [asdict(answer) for answer in prompt.answers],
        }

    def _remove_unnamed_images(self) -> None:
        """Remove every image that no record on disk names (a rolled-back or replaced step's)."""
        named = set()
        for path in recorded_steps(self.directory).values():
            record = read_record(path) or {"prompts": []}
            named |= {name for prompt in record["prompts"] for name in prompt.get("images", ())}
        for image in (self.directory / IMAGES_DIR).glob("*.png"):
            if f"{IMAGES_DIR}/{image.name}" not in named:
                image.unlink()


def _write_png(path: Path, image: torch.Tensor) -> None:
    """Write one uint8 ``(H, W, 3)`` RGB image as a PNG file, atomically."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    Image.fromarray(image.cpu().numpy()).save(temporary, format="PNG")  # (H, W, 3) uint8: RGB
    os.replace(temporary, path)
