"""What a trainer bundle ``checkpointing.checkpoint_dir/step_N/`` holds, and how the controller's part is stored.

    trainer.ckpt            Lightning's checkpoint: model, optimizer and scheduler state, loop progress (global_step),
                            and the policy's source (trainer/bundle_policy.py; what ``export`` rebuilds it from)
    sharded/                with several trainer ranks, the models and optimizers instead, as megatron-core's
                            distributed checkpoint (every rank writes its shards; a resume on another layout
                            reshards); trainer.ckpt then holds the rest
    controller_state.json   the trainer's weight version, the prompt stream's cursor, the sampler's dispatch index
    replay_index.json       the metadata-only replay index of the committed, unconsumed groups (digest-checked)
    data_plane/             the data plane's own snapshot: exactly those groups' rows
    rollout_recovery.pt     the pending prompt groups (taken from the dataset, not committed) to redispatch
    replacement_reserve.pt  the spare prompts held for dropped-rollout replacement (only when there are any)
    MANIFEST.json           size and SHA-256 of every file above, and the bundle format (written by
                            :func:`write_atomically`)

Every prompt taken from the dataset before the bundle was written is thus trained (its step is in trainer.ckpt),
buffered (replay index + rows), pending (rollout_recovery.pt), a spare (replacement_reserve.pt) or dropped
after its failure budget allowed it: a resume trains each at most once, and every one not dropped exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from sc_lightning.checkpoint.atomic import BundleError, complete_bundles, newest_intact

TRAINER_FILE = "trainer.ckpt"
CONTROLLER_FILE = "controller_state.json"
REPLAY_INDEX_FILE = "replay_index.json"
RECOVERY_FILE = "rollout_recovery.pt"
RESERVE_FILE = "replacement_reserve.pt"
DATA_PLANE_DIR = "data_plane"
SHARDED_DIR = "sharded"


def bundle_name(step: int) -> str:
    """The directory name of the bundle written after ``step`` RL steps."""
    return f"step_{step}"


def write_controller_files(directory: Path, state: dict[str, Any]) -> None:
    """Split a controller checkpoint state into the bundle's files (the rows are already in ``data_plane/``)."""
    rest = dict(state)
    (directory / REPLAY_INDEX_FILE).write_text(json.dumps(rest.pop("replay_index"), indent=1))
    torch.save(rest.pop("pending"), directory / RECOVERY_FILE)
    reserve = rest.pop("replacement_reserve", [])
    if reserve:
        torch.save(reserve, directory / RESERVE_FILE)
    (directory / CONTROLLER_FILE).write_text(json.dumps(rest, indent=1))


def read_controller_state(bundle: Path) -> dict[str, Any]:
    """The controller checkpoint state stored in ``bundle``; BundleError naming the file that cannot be read."""
    try:
        state = json.loads((bundle / CONTROLLER_FILE).read_text())
        state["replay_index"] = json.loads((bundle / REPLAY_INDEX_FILE).read_text())
        state["pending"] = torch.load(bundle / RECOVERY_FILE, weights_only=True)
        reserve = bundle / RESERVE_FILE
        state["replacement_reserve"] = torch.load(reserve, weights_only=True) if reserve.exists() else []
    except (OSError, ValueError, RuntimeError) as err:
        raise BundleError(
            f"{bundle}: the controller state cannot be read ({err}); resume from an earlier bundle"
        ) from None
    return state


def latest_bundle(checkpoint_dir: Path) -> Path | None:
    """The newest bundle in ``checkpoint_dir`` that verifies against its manifest, or None when there is none.

    A damaged one (truncated, altered, a file or the manifest missing) is skipped with a warning naming it and kept
    as it is; BundleError, naming each, when every bundle there is damaged (starting afresh would discard them)."""
    bundle, damaged = newest_intact([path for _, path in complete_bundles(checkpoint_dir)], "bundle")
    if bundle is not None:
        return bundle
    if damaged:
        raise BundleError(
            f"every bundle in {checkpoint_dir} is damaged, so none can be resumed: {'; '.join(damaged)}. Nothing was "
            "deleted; to start afresh, use a new checkpointing.checkpoint_dir"
        )
    return None
