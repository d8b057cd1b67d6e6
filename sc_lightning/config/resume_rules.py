"""What a checkpoint's saved controller state must satisfy to resume under this run's config: one function per rule.

Each rule raises :class:`ResumeMismatch` naming what differs — the knob, the checkpoint's value, this run's value —
and the fix. The same functions run twice: before anything starts, from the bundle's files and the config
(:func:`sc_lightning.checkpoint.resume_fit.check_resume_fits`, with every problem at once), and again where the
state is loaded (the prompt stream, the replay buffer, the controller's restore), as a safety net for Lightning
scripts that skip the first check. Plain data only: the saved state as read from ``controller_state.json``,
``replay_index.json`` and ``rollout_recovery.pt``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

CONTROLLER_STATE_VERSION = 1
PROMPT_STREAM_VERSION = 1
REPLAY_INDEX_VERSION = 1
ALGO = "{algo}"
"""How a rule names the algorithm's section when its caller does not know it (grpo or ppo)."""
FRESH_START = "or start afresh with a new checkpointing.checkpoint_dir (nothing was deleted)"


class ResumeMismatch(ValueError):
    """A checkpoint's saved state does not fit this run; the message names the knob, both values and the fix."""

    def __init__(self, problem: str) -> None:
        """``problem``: what differs and its own fix; the message adds the alternative of a fresh start."""
        super().__init__(f"{problem}, {FRESH_START}")
        self.problem = problem


def check_format(what: str, state: Mapping[str, Any], supported: int) -> None:
    """ResumeMismatch unless ``state`` (the saved ``what``) was written in the ``supported`` format version."""
    if state.get("version") != supported:
        raise ResumeMismatch(
            f"the {what} was written in format version {state.get('version')!r}, this version of sc_lightning reads "
            f"{supported}: resume with the sc_lightning that wrote it"
        )


def check_prompt_stream(
    saved: Mapping[str, Any], *, seed: int, shuffle: bool, batch_size: int, dataset_size: int | None, algo: str = ALGO
) -> None:
    """ResumeMismatch unless the saved prompt stream had this run's seed, shuffle, batch size and dataset size.

    ``dataset_size`` None (not known yet: the dataset is not loaded) skips that setting and the position check.
    """
    check_format("prompt stream state", saved, PROMPT_STREAM_VERSION)
    knobs = {
        "seed": (f"{algo}.seed", seed),
        "shuffle": ("data.shuffle", shuffle),
        "batch_size": (f"{algo}.num_prompts_per_step", batch_size),
        "dataset_size": ("the number of prompts of data.dataset_name", dataset_size),
    }
    changed = [
        f"{knob} is {_show(mine)} but the checkpoint's prompt stream has {_show(saved.get(key))}"
        for key, (knob, mine) in knobs.items()
        if mine is not None and saved.get(key) != mine
    ]
    if changed:
        raise ResumeMismatch(
            f"{'; '.join(changed)}: the prompt order would differ, so prompts would be trained twice or never; "
            "resume with the checkpoint's values"
        )
    if dataset_size is not None:
        epoch, position, batches = int(saved["epoch"]), int(saved["position"]), dataset_size // batch_size
        if epoch < 0 or not 0 <= position < batches:
            raise ResumeMismatch(
                f"the checkpoint's prompt stream stands at epoch {epoch}, batch {position}, outside this dataset's "
                f"{batches} batches per epoch (corrupt state); resume from an earlier bundle"
            )


def check_replay_index(index: Mapping[str, Any], *, group_size: int, algo: str = ALGO) -> list[dict[str, Any]]:
    """The replay index's groups; ResumeMismatch unless its format, digest and group size fit this run."""
    missing = {"version", "groups", "digest"} - set(index)
    if missing:
        raise ResumeMismatch(
            f"the replay index is missing {sorted(missing)} (corrupt state); resume from an earlier bundle"
        )
    check_format("replay index", index, REPLAY_INDEX_VERSION)
    groups = index["groups"]
    if replay_digest(groups) != index["digest"]:
        raise ResumeMismatch(
            "the replay index's digest does not match its groups (corrupt or edited); resume from an earlier bundle"
        )
    seen: set[str] = set()
    for group in groups:
        if len(group["keys"]) != group_size:
            raise ResumeMismatch(
                f"{algo}.num_generations_per_prompt is {group_size} but the checkpoint's buffered group "
                f"{group['group_id']} has {len(group['keys'])} generations; resume with "
                f"{algo}.num_generations_per_prompt {len(group['keys'])}"
            )
        duplicate = seen.intersection(group["keys"])
        if duplicate:
            raise ResumeMismatch(
                f"the replay index repeats row keys {sorted(duplicate)[:3]} (corrupt); resume from an earlier bundle"
            )
        seen.update(group["keys"])
    return groups


def replay_digest(groups: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of the canonical JSON of a replay index's groups."""
    canonical = json.dumps(list(groups), sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(canonical.encode()).hexdigest()


def held_permits(state: Mapping[str, Any]) -> tuple[int, int]:
    """``(buffered, dispatched)``: the groups of a controller state that held buffer permits at its cut.

    Buffered: the indexed groups but the step's claims (they had given theirs back; without indexed rows the claims
    are pending, not indexed). Dispatched: the pending groups that were launched (those still waiting for a permit
    wait again after a resume).
    """
    groups, claimed = len(state["replay_index"]["groups"]), int(state.get("claimed", 0))
    buffered = groups - (claimed if groups else 0)
    return buffered, int(state.get("pending_holding_permits", len(state["pending"])))


def check_buffer_capacity(buffered: int, dispatched: int, capacity: int) -> None:
    """ResumeMismatch when the checkpoint's groups holding buffer permits outnumber this run's buffer."""
    if buffered + dispatched > capacity:
        raise ResumeMismatch(
            f"async_rl.max_buffered_rollouts is {capacity} but the checkpoint holds {buffered} buffered and "
            f"{dispatched} dispatched prompt groups; resume with async_rl.max_buffered_rollouts >= "
            f"{buffered + dispatched}"
        )


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)
