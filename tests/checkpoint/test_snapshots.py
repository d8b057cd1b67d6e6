"""Rollout snapshots on disk: anchors, numbering, retention, and which one a restart selects (read-only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sc_lightning.checkpoint.atomic import BundleError, write_atomically
from sc_lightning.checkpoint.bundle import TRAINER_FILE, write_controller_files
from sc_lightning.checkpoint.fingerprint import FingerprintMismatch
from sc_lightning.checkpoint.snapshots import (
    BOOTSTRAP_DIR,
    SNAPSHOTS_DIR,
    SnapshotError,
    anchor_for,
    config_identity,
    next_snapshot_dir,
    prune_snapshots,
    resume_point,
    snapshot_dirs,
    sweep_temporaries,
)
from sc_lightning.config import load_config
from sc_lightning.config.yaml_io import load_yaml_layers
from tests.helpers.configs import TINY_PATH
from tests.helpers.controller_state import STATE

IDENTITY = {"grpo": {"seed": 7}, "env": {"name": "arithmetic"}}


def bundle(root: Path, step: int) -> Path:
    with write_atomically(root / f"step_{step}") as directory:
        (directory / TRAINER_FILE).write_bytes(b"trainer")
        write_controller_files(directory, STATE)
    return root / f"step_{step}"


def snapshot(anchor: Path) -> Path:
    with write_atomically(next_snapshot_dir(anchor)) as directory:
        write_controller_files(directory, STATE)
    return snapshot_dirs(anchor)[-1][1]


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_anchors_bootstrap_first_then_only_durable_trainer_bundles(tmp_path) -> None:
    bootstrap = anchor_for(tmp_path, 0, IDENTITY)
    assert bootstrap == tmp_path / BOOTSTRAP_DIR and json.loads((bootstrap / "BOOTSTRAP.json").read_text())
    assert anchor_for(tmp_path, 0, IDENTITY) == bootstrap  # the same lineage is reused
    assert anchor_for(tmp_path, 2, IDENTITY) is None  # step_2 is not durable yet: skip
    step_2 = bundle(tmp_path, 2)
    assert anchor_for(tmp_path, 2, IDENTITY) == step_2
    assert anchor_for(tmp_path, 0, IDENTITY) is None  # version 0 after a trainer bundle: never mix lineages


def test_a_different_config_never_writes_into_another_runs_bootstrap(tmp_path) -> None:
    anchor_for(tmp_path, 0, IDENTITY)
    with pytest.raises(FingerprintMismatch, match=r"grpo.seed: 7 -> 8"):
        anchor_for(tmp_path, 0, {**IDENTITY, "grpo": {"seed": 8}})


def test_snapshot_numbers_only_grow_even_past_an_interrupted_write(tmp_path) -> None:
    anchor = bundle(tmp_path, 1)
    first = snapshot(anchor)
    (anchor / SNAPSHOTS_DIR / "tmp_snapshot_000002_dead").mkdir()  # a crash mid-write
    assert next_snapshot_dir(anchor).name == "snapshot_000003"
    assert [n for n, _ in snapshot_dirs(anchor)] == [1] and first.name == "snapshot_000001"
    sweep_temporaries(tmp_path)
    assert not (anchor / SNAPSHOTS_DIR / "tmp_snapshot_000002_dead").exists()


def test_retention_keeps_the_latest_k_of_the_anchor_and_drops_what_can_never_be_selected(tmp_path) -> None:
    bootstrap = anchor_for(tmp_path, 0, IDENTITY)
    snapshot(bootstrap)
    old = bundle(tmp_path, 1)
    snapshot(old)
    new = bundle(tmp_path, 2)
    for _ in range(4):
        snapshot(new)
    removed = prune_snapshots(tmp_path, new, keep_latest_k=2)
    assert [n for n, _ in snapshot_dirs(new)] == [3, 4]
    assert snapshot_dirs(old) == [] and not bootstrap.exists()
    assert len(removed) == 4  # two old snapshots of the anchor, the older anchor's one, the bootstrap lineage
    sweep_temporaries(tmp_path)
    assert [p for p in tree(tmp_path) if "tmp_" in p] == []


def test_latest_resumes_from_the_newest_snapshot_that_verifies_under_the_latest_anchor(tmp_path) -> None:
    bundle(tmp_path, 1)
    anchor = bundle(tmp_path, 2)
    good, damaged = snapshot(anchor), snapshot(anchor)
    (damaged / "controller_state.json").write_text("{}")  # altered after it was written
    before = tree(tmp_path)
    point = resume_point(tmp_path, "latest", IDENTITY)
    assert point.trainer_checkpoint == anchor / TRAINER_FILE and point.state_dir == good
    assert tree(tmp_path) == before  # selection is read-only: the damaged snapshot is skipped, not deleted


def test_trainer_checkpoint_mode_ignores_newer_snapshots(tmp_path) -> None:
    anchor = bundle(tmp_path, 2)
    snapshot(anchor)
    point = resume_point(tmp_path, "trainer_checkpoint", IDENTITY)
    assert (point.trainer_checkpoint, point.state_dir) == (anchor / TRAINER_FILE, anchor)


def test_bootstrap_state_resumes_with_latest_and_the_initial_model(tmp_path) -> None:
    bootstrap = anchor_for(tmp_path, 0, IDENTITY)
    assert resume_point(tmp_path, "latest", IDENTITY) is None  # an anchor without snapshots: a fresh start
    first = snapshot(bootstrap)
    point = resume_point(tmp_path, "latest", IDENTITY)
    assert point.trainer_checkpoint is None and point.state_dir == first
    with pytest.raises(FingerprintMismatch, match=r"(?s)env.name: \"arithmetic\" -> \"math\".*Nothing was deleted"):
        resume_point(tmp_path, "latest", {**IDENTITY, "env": {"name": "math"}})


def tiny_identity(*overrides: str) -> dict:
    """The compatibility identity of grpo_tiny.yaml with ``overrides`` (``a.b=value``)."""
    config = load_config(load_yaml_layers([str(TINY_PATH)], list(overrides)), extra_top_level=("trainer",))
    return config_identity(config)


def test_a_bootstrap_resume_trains_longer_as_a_bundle_resume_does(tmp_path) -> None:
    """A larger grpo.max_num_steps resumes the bootstrap snapshot, also one an older version anchored with the run's
    length still in its identity; another seed is still refused."""
    first = snapshot(anchor_for(tmp_path, 0, tiny_identity("grpo.max_num_steps=2")))
    assert resume_point(tmp_path, "latest", tiny_identity("grpo.max_num_steps=400")).state_dir == first
    record = tmp_path / BOOTSTRAP_DIR / "BOOTSTRAP.json"
    older = json.loads(record.read_text())
    older["identity"]["grpo"]["max_num_steps"], older["fingerprint"] = 2, "written by an older version"
    record.write_text(json.dumps(older))
    assert resume_point(tmp_path, "latest", tiny_identity("grpo.max_num_steps=400")).state_dir == first
    with pytest.raises(FingerprintMismatch, match=r"grpo.seed: 7 -> 8"):
        resume_point(tmp_path, "latest", tiny_identity("grpo.seed=8"))


def test_an_anchor_written_before_a_knob_existed_resumes_at_its_default_only(tmp_path) -> None:
    """An older version's identity lacks the knobs added since: a run at their defaults resumes (they keep the older
    behaviour), one that moved such a knob off its default is refused, naming it. What the trainer records
    (train_data.jsonl, samples/) is no part of the identity."""
    first = snapshot(anchor_for(tmp_path, 0, tiny_identity()))
    record = tmp_path / BOOTSTRAP_DIR / "BOOTSTRAP.json"
    older = json.loads(record.read_text())
    del older["identity"]["data"]["clevr_kinds"], older["identity"]["on_policy_distillation"]
    older["fingerprint"] = "written by an older version"
    record.write_text(json.dumps(older))
    recording = ("data.train_data_log=true", "data.sample_log_prompts=0")
    assert resume_point(tmp_path, "latest", tiny_identity(*recording)).state_dir == first
    with pytest.raises(FingerprintMismatch, match=r'data.clevr_kinds: \["count", "colour"\] -> \["count"\]'):
        resume_point(tmp_path, "latest", tiny_identity("data.clevr_kinds=[count]"))


def test_trainer_checkpoint_mode_fails_on_bootstrap_only_state_and_deletes_nothing(tmp_path) -> None:
    snapshot(anchor_for(tmp_path, 0, IDENTITY))
    before = tree(tmp_path)
    with pytest.raises(SnapshotError, match=r"restore_mode: latest.*new checkpointing.checkpoint_dir.*Nothing"):
        resume_point(tmp_path, "trainer_checkpoint", IDENTITY)
    assert tree(tmp_path) == before


def test_a_damaged_latest_trainer_bundle_is_named(tmp_path) -> None:
    anchor = bundle(tmp_path, 3)
    (anchor / TRAINER_FILE).write_bytes(b"trunc")
    with pytest.raises(BundleError, match=r"step_3/trainer.ckpt: does not match"):
        resume_point(tmp_path, "latest", IDENTITY)
