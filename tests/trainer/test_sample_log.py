"""samples/: the sampled answers of a few prompts, decoded from the trained rows in the data plane, recorded at the
first step, every N-th and the last, with each prompt's images as PNG files, and rolled back on resume."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sc_lightning.controller.api import GroupMeta
from sc_lightning.controller.rows import group_to_columns
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.models.spec import BUILTIN_SPECS
from sc_lightning.rollout.images import array_image, image_prompt_ids
from sc_lightning.tokenizer import CharImageTokenizer
from sc_lightning.trainer.sample_log import (
    SampledAnswer,
    SampledPrompt,
    SampleLog,
    read_sampled_prompts,
    recorded_steps,
)
from sc_lightning.types import Generation, Prompt, ScoredGroup
from tests.helpers.images import pattern

TOK, FMT = CharImageTokenizer(), BUILTIN_SPECS["builtin:tiny-vlm"].vision  # 32x32 images, 16 <image> ids each
ANSWERS = (("7", "stop"), ("12", "stop"), ("99999", "length"))


def scene_group(index: int, question: str, images: int) -> ScoredGroup:
    """A prompt with ``images`` scenes (seeded patterns) and three answers: right, wrong, cut at max_new_tokens."""
    size = FMT.image_size
    scenes = tuple(array_image(pattern(size, size, seed=10 * index + k), size) for k in range(images))
    ids = image_prompt_ids(TOK, question, images, FMT)
    prompt = Prompt(f"clevr-{index:03d}", ids, index=index, images=scenes)
    generations = []
    for text, why in ANSWERS:
        tokens = (*TOK.encode(text), *([TOK.EOS] if why == "stop" else []))
        generations.append(Generation(tokens, (-0.5,) * len(tokens), why, 3))
    return ScoredGroup(prompt, tuple(generations), (1.0, 0.0, 0.25))


def stored(groups: list[ScoredGroup]) -> tuple[MemoryDataPlane, list[GroupMeta]]:
    """``groups`` committed to an in-process data plane as the controller commits them, and their metadata."""
    plane, metas = MemoryDataPlane(), []
    for index, group in enumerate(groups):
        keys, columns, tags = group_to_columns(f"g{index}", group, start_weight=3, end_weight=4)
        plane.put(keys, columns, tags)
        lengths = tuple(len(group.prompt.token_ids) + len(g.token_ids) for g in group.generations)
        metas.append(GroupMeta(f"g{index}", group.prompt.prompt_id, tuple(keys), lengths, 3, 4, None))
    return plane, metas


def test_the_trained_rows_are_read_back_as_prompt_text_images_and_answers() -> None:
    groups = [scene_group(0, "+1=", 1), scene_group(1, "<image>-<image>=", 2), scene_group(2, "*2=", 1)]
    plane, metas = stored(groups)
    prompts = read_sampled_prompts(plane, metas[:2], TOK, FMT)
    assert [p.prompt for p in prompts] == ["<image>+1=", "<image>-<image>="]  # the third group was not asked for
    assert [(p.prompt_id, p.prompt_index, p.group_id, p.start_weight) for p in prompts] == [
        ("clevr-000", 0, "g0", 3),
        ("clevr-001", 1, "g1", 3),
    ]
    assert prompts[0].answers == [
        SampledAnswer(0, "7", 1.0, False),  # eos is not text
        SampledAnswer(1, "12", 0.0, False),
        SampledAnswer(2, "99999", 0.25, True),
    ]
    for prompt, group in zip(prompts, groups, strict=False):
        assert prompt.images is not None and prompt.images.shape == (len(group.prompt.images), 32, 32, 3)
        for image, scene in zip(prompt.images, group.prompt.images, strict=True):
            assert image.numpy().tobytes() == scene.pixels

    text = read_sampled_prompts(plane, metas[2:], TOK)  # a text policy: no images read, ids decoded as text
    assert text[0].prompt == "*2=" and text[0].images is None
    assert read_sampled_prompts(plane, [], TOK) == []


def prompt(step: int, images: int = 1) -> SampledPrompt:
    """A recorded prompt of ``step`` (its own prompt id and scenes)."""
    pixels = torch.stack([torch.from_numpy(pattern(8, 8, seed=step * 10 + k)) for k in range(images)])
    answers = [SampledAnswer(0, f"answer {step}", 1.0, False), SampledAnswer(1, "x", 0.0, True)]
    return SampledPrompt(f"p{step}", step, f"g{step}", step - 1, f"<image>question {step}", answers, pixels)


def images_on_disk(directory: Path) -> set[str]:
    return {path.name for path in (directory / "images").glob("*")}


def run_steps(log: SampleLog, steps: range) -> None:
    for step in steps:
        log.record(step, [prompt(step)])


def test_a_record_holds_the_first_step_every_nth_and_the_last(tmp_path: Path) -> None:
    directory = tmp_path / "samples"
    log = SampleLog(directory, every_n_steps=3)
    log.open(resume_step=0)
    run_steps(log, range(8))
    assert list(recorded_steps(directory)) == [0, 3, 6]  # step 7 waits in memory for the fit's end
    log.close()
    assert list(recorded_steps(directory)) == [0, 3, 6, 7]
    assert images_on_disk(directory) == {"p0_0.png", "p3_0.png", "p6_0.png", "p7_0.png"}  # none of steps 1, 2, 4, 5

    record = json.loads((directory / "step_000007.json").read_text())
    assert record == {
        "step": 7,
        "prompts": [
            {
                "prompt_id": "p7",
                "prompt_index": 7,
                "group_id": "g7",
                "start_weight": 6,
                "prompt": "<image>question 7",
                "images": ["images/p7_0.png"],
                "answers": [
                    {"generation_index": 0, "text": "answer 7", "reward": 1.0, "truncated": False},
                    {"generation_index": 1, "text": "x", "reward": 0.0, "truncated": True},
                ],
            }
        ],
    }
    png = np.asarray(Image.open(directory / "images" / "p7_0.png"))
    assert png.shape == (8, 8, 3) and (png == pattern(8, 8, seed=70)).all()  # the pixels, exactly


def test_a_resume_keeps_only_the_steps_its_checkpoint_holds(tmp_path: Path) -> None:
    directory = tmp_path / "samples"
    log = SampleLog(directory, every_n_steps=3)
    log.open(resume_step=0)
    run_steps(log, range(8))
    log.close()  # on record: 0, 3, 6, 7
    (directory / ".step_000008.json.tmp").write_text('{"st')  # a write a kill cut short

    log.open(resume_step=5)  # the bundle of step 5: steps 0-4 trained
    assert list(recorded_steps(directory)) == [0, 3]
    assert images_on_disk(directory) == {"p0_0.png", "p3_0.png"}  # the rolled-back steps' images went with them
    assert not list(directory.glob(".*.tmp"))
    run_steps(log, range(5, 7))
    log.close()
    assert list(recorded_steps(directory)) == [0, 3, 6]  # no step twice, none past what the run trained

    log.open(resume_step=7)  # a process that ended at step 6 and one that goes on
    run_steps(log, range(7, 9))
    log.close()
    assert list(recorded_steps(directory)) == [0, 3, 6, 8]  # step 7 was the latest only until step 8 came

    log.open(resume_step=0)  # a fresh run in the same directory starts a fresh record
    assert recorded_steps(directory) == {} and images_on_disk(directory) == set()


def test_the_previous_process_last_step_gives_way_to_a_later_one(tmp_path: Path) -> None:
    directory = tmp_path / "samples"
    log = SampleLog(directory, every_n_steps=10)
    log.open(resume_step=0)
    run_steps(log, range(4))
    log.close()  # a stop signal after step 3
    assert list(recorded_steps(directory)) == [0, 3]
    log.open(resume_step=4)
    run_steps(log, range(4, 12))
    assert list(recorded_steps(directory)) == [0, 10]  # step 3 was not the last step after all
    assert images_on_disk(directory) == {"p0_0.png", "p10_0.png"}
    log.close()
    assert list(recorded_steps(directory)) == [0, 10, 11]


def test_a_run_that_starts_recording_late_records_its_first_step(tmp_path: Path) -> None:
    """A resumed run whose earlier process recorded nothing: its first recorded step is the one it resumes at."""
    log = SampleLog(tmp_path / "samples", every_n_steps=10)
    log.open(resume_step=4)
    run_steps(log, range(4, 6))
    log.close()
    assert list(recorded_steps(tmp_path / "samples")) == [4, 5]


def test_a_text_prompt_writes_no_images_and_an_image_name_is_a_file_name(tmp_path: Path) -> None:
    directory = tmp_path / "samples"
    log = SampleLog(directory, every_n_steps=1)
    log.open(resume_step=0)
    text = SampledPrompt("t", 3, "g", 0, "2+2=", [SampledAnswer(0, "4", 1.0, False)])
    two = dataclasses.replace(prompt(1, images=2), prompt_id="rows.jsonl/3")  # a "/" a file name cannot hold
    log.record(0, [text, two])
    log.close()
    record = json.loads((directory / "step_000000.json").read_text())
    assert [p["images"] for p in record["prompts"]] == [[], ["images/rows.jsonl_3_0.png", "images/rows.jsonl_3_1.png"]]
    assert images_on_disk(directory) == {"rows.jsonl_3_0.png", "rows.jsonl_3_1.png"}


def test_recording_needs_open_and_every_n_steps_is_positive(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="open"):
        SampleLog(tmp_path, every_n_steps=1).record(0, [])
    with pytest.raises(ValueError, match="every_n_steps"):
        SampleLog(tmp_path, every_n_steps=0)
