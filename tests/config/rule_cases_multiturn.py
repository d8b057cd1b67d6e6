"""Rule cases for the multi-turn rules (rules_multiturn.py)."""

from __future__ import annotations

from typing import Any

from tests.config.rule_builders import ppo
from tests.conftest import variant

MULTITURN = {"env": {"name": "calculator", "max_conversation_tokens": 32}, "data": {"dataset_name": "calculator"}}

MULTITURN_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    (
        "conversations fit the rows",
        variant(MULTITURN),
        variant(MULTITURN, {"env": {"max_conversation_tokens": 33}}),
        "env.max_conversation_tokens",
        "exceeds policy.max_total_sequence_length (32)",
    ),
    ("multi-turn needs grpo", variant(MULTITURN), ppo(MULTITURN), "env.name", "trains with GRPO only"),
    (
        "multi-turn without validation",
        variant(MULTITURN),
        variant(MULTITURN, {"grpo": {"val_period": 5}, "data": {"val_dataset_name": "v.jsonl"}}),
        "grpo.val_period",
        "set val_period: 0",
    ),
    (
        "multi-turn without token capture",
        variant(MULTITURN),
        variant(MULTITURN, {"token_capture": {"enabled": True}}),
        "token_capture.enabled",
        "regenerates unfinished conversations",
    ),
]
