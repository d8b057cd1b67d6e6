"""A controller's checkpoint state as a bundle holds it: prompt stream, dispatch and replay positions, a pending
prompt."""

from __future__ import annotations

from typing import Any

STATE: dict[str, Any] = {
    "version": 1,
    "trainer_version": 7,
    "prompts": {"version": 1, "epoch": 0, "position": 3, "seed": 1, "shuffle": True, "batch_size": 4},
    "dispatch_index": 8,
    "replay_index": {"version": 1, "groups": [{"group_id": "g", "keys": ["g/g0"]}], "digest": "abc"},
    "pending": [{"prompt": {"prompt_id": "p", "token_ids": [2, 5], "extra": {"k": [1]}}, "target_step": 8}],
}
