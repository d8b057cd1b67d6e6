"""Whether a resume's saved state fits this run, decided from its files and the config before anything starts.

The rules are :mod:`sc_lightning.config.resume_rules`' (the restore applies them again); here they read the state
directory's ``controller_state.json``, ``replay_index.json``, ``rollout_recovery.pt`` and the data-plane snapshot's
``manifest.json`` (its format version) — no dataset, model, engine or data plane is needed — so ``fit`` and
``validate`` refuse a checkpoint that does not fit in seconds. The dataset's size is the one rule left to the
restore (it needs the dataset loaded).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sc_lightning.checkpoint.bundle import DATA_PLANE_DIR, read_controller_state
from sc_lightning.config import SCConfig, resolve
from sc_lightning.config.resume_rules import (
    CONTROLLER_STATE_VERSION,
    ResumeMismatch,
    check_buffer_capacity,
    check_format,
    check_prompt_stream,
    check_replay_index,
    held_permits,
)
from sc_lightning.data_plane.snapshot_files import MANIFEST, SnapshotFormatError, check_version


def check_resume_fits(state_dir: Path, config: SCConfig) -> None:
    """ResumeMismatch naming every rule the saved state in ``state_dir`` (a bundle or snapshot) breaks under
    ``config``; BundleError when its controller files cannot be read."""
    state = read_controller_state(state_dir)
    algo, name = config.algo, config.algo_name
    resolved = resolve(config)
    rules: list[Callable[[], object]] = [
        lambda: check_format("controller state", state, CONTROLLER_STATE_VERSION),
        lambda: check_prompt_stream(
            state.get("prompts", {}),
            seed=algo.seed,
            shuffle=config.data.shuffle,
            batch_size=resolved.groups_per_step,
            dataset_size=None,
            algo=name,
        ),
        lambda: check_replay_index(state["replay_index"], group_size=algo.num_generations_per_prompt, algo=name),
        lambda: check_buffer_capacity(*held_permits(state), resolved.max_buffered_rollouts),
        lambda: check_rows_format(state_dir, state),
    ]
    problems = []
    for rule in rules:
        try:
            rule()
        except ResumeMismatch as err:
            problems.append(err.problem)
    if problems:
        raise ResumeMismatch(f"{state_dir} does not fit this run: {'; '.join(problems)}")


def check_rows_format(state_dir: Path, state: dict[str, Any]) -> None:
    """ResumeMismatch when the rows ``state_dir`` holds (its data-plane snapshot) are of a format this code does not
    read; an older, readable one is upgraded when loaded (:mod:`sc_lightning.data_plane.migrations`)."""
    manifest = state_dir / DATA_PLANE_DIR / MANIFEST
    if not state.get("rows_indexed", True) or not manifest.exists():
        return
    try:
        check_version(manifest, json.loads(manifest.read_text()))
    except SnapshotFormatError as err:
        raise ResumeMismatch(str(err)) from None
