"""Resume through real fits (FAKE scripted engine): a sampler without buffer checkpoints loses no prompt."""

from __future__ import annotations

import json
from collections import Counter

from sc_lightning.callbacks.checkpoint import BundleCheckpoint
from sc_lightning.checkpoint.bundle import DATA_PLANE_DIR, TRAINER_FILE, latest_bundle, read_controller_state
from tests.helpers.fits import fit, tiny_config


def test_shadow_mode_regenerates_the_buffered_groups_and_trains_each_prompt_once(tmp_path) -> None:
    """One version ahead, so groups are buffered at the bundle; the custom sampler cannot restore them."""
    knobs = [
        "policy.generation.colocated.enabled=false",
        "async_rl.sampler.name=custom",
        "async_rl.sampler.target=tests.controller.custom:NoReplayInOrder",
        "async_rl.sampler.init_args.gate_window=1",
        "async_rl.max_buffered_rollouts=8",
        "async_rl.max_inflight_prompts=8",
        "checkpointing.enabled=true",
        "checkpointing.save_data_plane=true",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "checkpointing.save_period=3",
        "data.train_data_log=true",
    ]
    first = tiny_config("grpo.max_num_steps=3", *knobs)
    fit(first, [BundleCheckpoint(first.checkpointing, max_steps=3)], root=tmp_path)
    bundle = latest_bundle(tmp_path / "ckpt")
    state = read_controller_state(bundle)
    assert not state["rows_indexed"] and state["replay_index"]["groups"] == []
    assert (bundle / DATA_PLANE_DIR).is_dir()  # shadow mode: the rows are kept, not used
    # steps 3 and 4's groups (one version ahead), buffered or in flight at the bundle: listed to regenerate
    targets = Counter(entry["target_step"] for entry in state["pending"])
    assert targets[3] == 4 and set(targets) <= {3, 4}

    second = tiny_config("grpo.max_num_steps=6", *knobs)
    trainer, _ = fit(
        second,
        [BundleCheckpoint(second.checkpointing, max_steps=6)],
        root=tmp_path,
        ckpt_path=str(bundle / TRAINER_FILE),
    )
    assert trainer.global_step == 6
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    per_prompt = Counter(row["prompt_index"] for row in rows)
    assert sorted({row["step"] for row in rows}) == list(range(6))
    assert len(per_prompt) == 24 and set(per_prompt.values()) == {4}  # 6 steps x 4 prompts, each once
    # and exactly the prompts an uninterrupted run trains: none was skipped by the resume
    straight = tiny_config("grpo.max_num_steps=6", *knobs[:6], "data.train_data_log=true")
    fit(straight, [], root=tmp_path / "straight")
    lines = (tmp_path / "straight" / "train_data.jsonl").read_text().splitlines()
    assert set(per_prompt) == {json.loads(line)["prompt_index"] for line in lines}
