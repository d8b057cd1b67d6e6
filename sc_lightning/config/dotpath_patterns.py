"""Dotpath patterns, and the knobs that no fingerprint exclusion may cover.

A pattern is a dotpath whose segments match with ``fnmatch`` (``*`` one mapping key or list index, ``?``,
``[...]``), and ``**`` matches any number of levels, zero included. The bootstrap fingerprint
(:mod:`sc_lightning.checkpoint.fingerprint`) leaves out what its patterns match; the config rules refuse a user's
pattern that would leave out a knob of :data:`ROLLOUT_KNOBS`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

ROLLOUT_KNOBS = (
    "data.dataset_name",
    "data.max_prompt_length",
    "data.shuffle",
    "env.name",
    "policy.model_name",
    "policy.tokenizer_name",
    "policy.generation.backend",
    "policy.generation.temperature",
    "policy.generation.top_p",
    "policy.generation.top_k",
    "policy.generation.max_new_tokens",
    "grpo.seed",
    "ppo.seed",
    "grpo.num_prompts_per_step",
    "ppo.num_prompts_per_step",
    "grpo.num_generations_per_prompt",
    "ppo.num_generations_per_prompt",
)
"""Knobs that decide which prompts a run draws, how the engine answers them and how the answers are scored: a
rollout snapshot's groups are valid only under the same values, so a restore must see them change."""


def path_matches(path: Sequence[str], pattern: Sequence[str]) -> bool:
    """Whether the dotpath ``path`` (its segments) matches ``pattern`` (``*`` one level, ``**`` any number)."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(path_matches(path[i:], rest) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], head) and path_matches(path[1:], rest)


def rollout_knobs_covered(pattern: str) -> list[str]:
    """The :data:`ROLLOUT_KNOBS` that ``pattern`` leaves out: those it matches, or a section above them."""
    segments = pattern.split(".")
    return [
        knob
        for knob in ROLLOUT_KNOBS
        if any(path_matches(knob.split(".")[:depth], segments) for depth in range(1, knob.count(".") + 2))
    ]
