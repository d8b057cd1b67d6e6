"""A vision-language run killed with SIGKILL resumes exactly once with its image prompts (issue 39).

configs/grpo_tiny_vlm.yaml on small steps, one version ahead, a bundle with its data-plane snapshot after every step:
two kills land after new bundles, and the restarted command finishes. The final run's history trains each step's
groups whole and no prompt twice; every row trained, before and after the restarts, held its scene; and the samples/
record, rolled back at each restart, holds the first, every third and the last step, each with its scenes and the
answers the final history trained. The trainer
refuses a row without its images (MissingRowsError), so the buffered rows a restart restores from the snapshot, and
the pending prompts it redispatches from the recovery ledger, reached it with their pixels. Real CLI, megatron-core
VLM, Megatron engine in its Ray actor, controller and TransferQueue data plane.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sc_lightning.tasks.clevr import BACKGROUND, IMAGE_SIZE
from tests.helpers.configs import REPO
from tests.helpers.recovery import a_new_bundle, assert_history_exactly_once, command, run_until_done

pytestmark = pytest.mark.slow

STEPS, GROUPS, GENERATIONS = 8, 4, 4
SAMPLE_EVERY = 3  # data.sample_log_every_n_steps: steps 0, 3, 6 and the last, 7


@pytest.mark.long(minutes=1)
def test_sigkill_mid_vlm_run_resumes_exactly_once_with_the_scenes(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    argv = command(
        tmp_path,
        (REPO / "configs" / "grpo_tiny_vlm.yaml",),
        "--data.dataset_name", "clevr",
        "--grpo.max_num_steps", str(STEPS),
        "--grpo.num_prompts_per_step", str(GROUPS),
        "--grpo.num_generations_per_prompt", str(GENERATIONS),
        "--policy.train_global_batch_size", str(GROUPS * GENERATIONS),
        "--policy.train_micro_batch_size", str(GROUPS * GENERATIONS),
        "--async_rl.min_groups_for_streaming_train", str(GROUPS),
        "--async_rl.max_buffered_rollouts", str(2 * GROUPS),
        "--async_rl.max_inflight_prompts", str(2 * GROUPS),
        "--checkpointing.save_period", "1",
        "--data.sample_log_every_n_steps", str(SAMPLE_EVERY),
        '--trainer.callbacks=[{"class_path": "tests.helpers.callbacks.TrainedTokens"}]',
    )  # fmt: skip

    kills, stderrs = run_until_done(argv, [(a_new_bundle(checkpoints), 0.5)] * 2, seed=39)

    assert kills == 2, f"only {kills} kills landed"
    assert all(any(line.startswith("resuming from") for line in err.splitlines()) for err in stderrs[1:])
    assert_history_exactly_once(tmp_path, steps=STEPS, groups=GROUPS, generations=GENERATIONS)
    rows = [json.loads(line) for line in (tmp_path / "trained_tokens.jsonl").read_text().splitlines()]
    grey = IMAGE_SIZE * IMAGE_SIZE * sum(BACKGROUND)
    assert {row["step"] for row in rows} == set(range(STEPS))
    for row in rows:  # one scene each, with objects on the grey ground
        ((height, width, channels, total),) = row["images"]
        assert (height, width, channels) == (IMAGE_SIZE, IMAGE_SIZE, 3) and total != grey, row["step"]
    assert_samples_record(tmp_path, rows)


def assert_samples_record(run_dir: Path, trained_rows: list[dict]) -> None:
    """samples/ after the restarts: steps 0, 3, 6 and 7, none twice and none a killed process trained past its
    bundle; each with the step's 4 prompts, their scene as a PNG (one the step trained) and every answer with the
    reward the final history (train_data.jsonl) gave it; no image that no record names."""
    records = {int(path.stem.removeprefix("step_")): json.loads(path.read_text()) for path in
               (run_dir / "samples").glob("step_*.json")}  # fmt: skip
    assert sorted(records) == [0, 3, 6, STEPS - 1]
    history = [json.loads(line) for line in (run_dir / "train_data.jsonl").read_text().splitlines()]
    rewards = {(row["step"], row["group_id"], row["generation_index"]): row["reward"] for row in history}
    named = set()
    for step, record in records.items():
        assert len(record["prompts"]) == GROUPS
        scenes = {tuple(image) for row in trained_rows if row["step"] == step for image in row["images"]}
        for prompt in record["prompts"]:
            assert prompt["prompt"].startswith("<image>") and prompt["prompt"].count("<image>") == 1
            assert [a["generation_index"] for a in prompt["answers"]] == list(range(GENERATIONS))
            for answer in prompt["answers"]:
                assert answer["reward"] == rewards[(step, prompt["group_id"], answer["generation_index"])]
                assert "<image>" not in answer["text"]
            (image,) = prompt["images"]
            pixels = np.asarray(Image.open(run_dir / "samples" / image), dtype=np.int64)
            assert (*pixels.shape, int(pixels.sum())) in scenes, (step, image)  # a scene the step trained
            named.add(image)
    assert {f"images/{path.name}" for path in (run_dir / "samples" / "images").iterdir()} == named
