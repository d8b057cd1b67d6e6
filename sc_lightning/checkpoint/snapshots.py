"""Periodic rollout snapshots: where they go, which anchor they hang from, which one a restart resumes from.

A rollout snapshot holds the same controller files and data-plane rows as a trainer bundle, taken at any moment
(mid-step included) while the trainer state is that of an *anchor*:

    checkpoint_dir/step_N/rollout_snapshots/snapshot_000007/     anchored to the trainer bundle step_N
    checkpoint_dir/bootstrap/BOOTSTRAP.json                      before the first trainer bundle: the initial
    checkpoint_dir/bootstrap/rollout_snapshots/snapshot_000003/  model plus the config's compatibility identity

A snapshot is taken only when the trainer's weight version N has a durable anchor (``step_N`` written, or N = 0
and no bundle yet); otherwise the attempt is skipped. Each snapshot is written with
:func:`~sc_lightning.checkpoint.atomic.write_atomically`, so an interrupted one is never selected.

:func:`resume_point` picks what a restart loads, read-only: with ``restore_mode: latest`` the newest snapshot that
verifies under the latest anchor (damaged ones are skipped with a warning), else the trainer bundle itself; with
``trainer_checkpoint`` the trainer bundle only — and, with no trainer bundle but bootstrap state present, an error
(it never ignores or deletes that state). A bootstrap restore first checks the config's fingerprint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sc_lightning.checkpoint.atomic import (
    BundleError,
    complete_bundles,
    newest_intact,
    remove_stale_temporaries,
    write_atomically,
)
from sc_lightning.checkpoint.bundle import TRAINER_FILE, bundle_name, latest_bundle, read_controller_state
from sc_lightning.checkpoint.fingerprint import (
    check_compatible,
    compatibility_identity,
    fingerprint,
    with_added_knobs,
)
from sc_lightning.checkpoint.retention import remove_bundle
from sc_lightning.config import SCConfig
from sc_lightning.config.schema import config_to_dict

SNAPSHOTS_DIR = "rollout_snapshots"
BOOTSTRAP_DIR = "bootstrap"
BOOTSTRAP_FILE = "BOOTSTRAP.json"
SNAPSHOT_PATTERN = r"snapshot_(\d+)"


class SnapshotError(RuntimeError):
    """Rollout snapshot state cannot be used as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ResumePoint:
    """What a restart loads: Lightning's checkpoint (None for bootstrap) and the controller state's directory."""

    trainer_checkpoint: Path | None
    state_dir: Path

    def describe(self) -> str:
        """One line for the log."""
        return f"{self.state_dir}" + ("" if self.trainer_checkpoint else " (bootstrap: the initial model)")

    @property
    def step(self) -> int:
        """The RL steps trained at this point: its trainer bundle's N (0 for bootstrap state)."""
        if self.trainer_checkpoint is None:
            return 0
        return int(self.trainer_checkpoint.parent.name.rpartition("_")[2])  # the bundle's name: step_N


def nothing_left_to_train(resume: ResumePoint | None, config: SCConfig) -> str | None:
    """The line a run prints instead of starting when its newest bundle has nothing left to train (None: it has):
    it is at ``max_num_steps``, or every prompt of ``max_num_epochs`` passes is trained (none buffered or pending).
    Nothing is started or changed."""
    if resume is None or resume.trainer_checkpoint is None:
        return None
    bundle, algo, steps = resume.trainer_checkpoint.parent, config.algo_name, config.algo.max_num_steps
    if resume.step >= steps:
        return (
            f"nothing left to train: the newest bundle {bundle} is at step {resume.step}, and {algo}.max_num_steps "
            f"is {steps}; to train longer, run the same command with a larger --{algo}.max_num_steps"
        )
    state = read_controller_state(resume.state_dir)
    epochs = config.algo.max_num_epochs
    left = state["replay_index"]["groups"] or state["pending"] or state["replacement_reserve"]
    if "prompts" not in state or state["prompts"]["epoch"] < epochs or left:
        return None
    return (
        f"nothing left to train: the newest bundle {bundle} (step {resume.step}) has trained every prompt of "
        f"{algo}.max_num_epochs={epochs} passes over the dataset; to train longer, run the same command with a "
        f"larger --{algo}.max_num_epochs"
    )


def config_identity(config: SCConfig) -> dict[str, Any]:
    """The config's compatibility identity: everything but operational and user-excluded dotpaths."""
    excluded = config.rollout_checkpointing.extra_fingerprint_excluded_paths
    return compatibility_identity(config_to_dict(config), excluded)


def snapshot_dirs(anchor: Path) -> list[tuple[int, Path]]:
    """``(number, path)`` of the complete snapshots under ``anchor``, oldest first."""
    return complete_bundles(anchor / SNAPSHOTS_DIR, SNAPSHOT_PATTERN)


def anchor_for(checkpoint_dir: Path, trainer_version: int, identity: dict[str, Any]) -> Path | None:
    """The durable anchor of ``trainer_version``, creating the bootstrap anchor on first use; None: not yet durable.

    At version 0 with no trainer bundle the anchor is ``bootstrap/`` (its identity is checked against
    ``identity``: a different config never writes into another run's bootstrap lineage).
    """
    if trainer_version > 0:
        anchor = checkpoint_dir / bundle_name(trainer_version)
        return anchor if anchor.is_dir() else None
    if complete_bundles(checkpoint_dir):
        return None  # version 0 after a trainer bundle cannot happen in one lineage; never mix
    return bootstrap_anchor(checkpoint_dir, identity)


def bootstrap_anchor(checkpoint_dir: Path, identity: dict[str, Any]) -> Path:
    """``bootstrap/``, written once (atomically) with the identity; a later run must have a compatible config."""
    anchor = checkpoint_dir / BOOTSTRAP_DIR
    if anchor.is_dir():
        check_bootstrap(anchor, identity)
        return anchor
    with write_atomically(anchor) as directory:
        record = {"fingerprint": fingerprint(identity), "identity": identity}
        (directory / BOOTSTRAP_FILE).write_text(json.dumps(record, indent=1, sort_keys=True, default=str))
    return anchor


def check_bootstrap(anchor: Path, identity: dict[str, Any]) -> None:
    """FingerprintMismatch naming the changed dotpaths unless ``identity`` matches the bootstrap anchor's.

    The saved identity loses today's built-in exclusions first, so an anchor written before a path joined them
    still fits, and gains the defaults of knobs added since it was written (a run at those defaults still fits).
    """
    try:
        saved = json.loads((anchor / BOOTSTRAP_FILE).read_text())
    except (OSError, ValueError) as err:
        raise BundleError(f"{anchor / BOOTSTRAP_FILE}: unreadable ({err}); nothing was deleted") from None
    if saved.get("fingerprint") != fingerprint(identity):
        older = compatibility_identity(saved.get("identity", {}))
        defaults = config_to_dict(SCConfig())
        check_compatible(with_added_knobs(older, identity, defaults), identity, where=str(anchor))


def next_snapshot_dir(anchor: Path) -> Path:
    """Where the next snapshot under ``anchor`` goes (numbers only grow, temporaries included)."""
    root = anchor / SNAPSHOTS_DIR
    numbers = [n for n, _ in snapshot_dirs(anchor)]
    if root.is_dir():  # an interrupted write's number is not reused either
        numbers += [int(m.group(1)) for p in root.iterdir() if (m := re.search(SNAPSHOT_PATTERN, p.name))]
    return root / f"snapshot_{max(numbers, default=0) + 1:06d}"


def prune_snapshots(checkpoint_dir: Path, anchor: Path, keep_latest_k: int) -> list[Path]:
    """Retention after a snapshot under ``anchor``: its newest ``keep_latest_k`` stay; nothing else can be selected.

    Snapshots of older trainer anchors are removed (a restart uses the latest anchor only), and so is the whole
    bootstrap lineage once a trainer bundle exists. Returns what was removed.
    """
    removed = [path for _, path in snapshot_dirs(anchor)[:-keep_latest_k]]
    for _, bundle in complete_bundles(checkpoint_dir):
        if bundle != anchor:
            removed += [path for _, path in snapshot_dirs(bundle)]
    bootstrap = checkpoint_dir / BOOTSTRAP_DIR
    if anchor != bootstrap and bootstrap.is_dir():
        removed.append(bootstrap)
    for path in removed:
        remove_bundle(path)
    return removed


def sweep_temporaries(checkpoint_dir: Path) -> None:
    """Remove what interrupted writes left: bundle temporaries and every anchor's snapshot temporaries."""
    remove_stale_temporaries(checkpoint_dir)
    anchors = [path for _, path in complete_bundles(checkpoint_dir)] + [checkpoint_dir / BOOTSTRAP_DIR]
    for anchor in anchors:
        remove_stale_temporaries(anchor / SNAPSHOTS_DIR)


def _newest_verified_snapshot(anchor: Path) -> Path | None:
    return newest_intact([path for _, path in snapshot_dirs(anchor)], "rollout snapshot")[0]


def resume_point(
    checkpoint_dir: Path, restore_mode: Literal["latest", "trainer_checkpoint"], identity: dict[str, Any]
) -> ResumePoint | None:
    """What a restart loads (None: start fresh). Read-only; see the module docstring for the rules."""
    bundle = latest_bundle(checkpoint_dir)
    bootstrap = checkpoint_dir / BOOTSTRAP_DIR
    if restore_mode == "trainer_checkpoint":
        if bundle is not None:
            return ResumePoint(bundle / TRAINER_FILE, bundle)
        if bootstrap.is_dir():
            raise SnapshotError(
                f"rollout_checkpointing.restore_mode is trainer_checkpoint but {checkpoint_dir} holds bootstrap "
                f"rollout state ({bootstrap}) and no trainer checkpoint: that state has no model to go with it. "
                "Recover it with restore_mode: latest, or start from scratch with a new checkpointing.checkpoint_dir. "
                "Nothing was deleted."
            )
        return None
    if bundle is not None:
        snapshot = _newest_verified_snapshot(bundle)
        return ResumePoint(bundle / TRAINER_FILE, snapshot or bundle)
    if bootstrap.is_dir():
        check_bootstrap(bootstrap, identity)
        snapshot = _newest_verified_snapshot(bootstrap)
        return ResumePoint(None, snapshot) if snapshot is not None else None
    return None
