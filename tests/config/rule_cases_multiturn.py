"""Rule cases for the multi-turn rules (config/rules/multiturn.py)."""

from __future__ import annotations

from typing import Any

from tests.config.rule_builders import ppo
from tests.helpers.configs import variant

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
    (
        "multi-turn prompts are chat-rendered (jsonl)",
        variant(MULTITURN, {"data": {"dataset_name": "p.jsonl", "apply_chat_template": True}}),
        variant(MULTITURN, {"data": {"dataset_name": "p.jsonl"}}),
        "data.apply_chat_template",
        "set data.apply_chat_template: true",
    ),
    (
        "multi-turn prompts are chat-rendered (arithmetic)",
        variant(MULTITURN),
        variant(MULTITURN, {"data": {"dataset_name": "arithmetic"}}),
        "data.dataset_name",
        "use calculator, or a .jsonl file",
    ),
    (
        "the chat template applies to jsonl datasets",
        variant({"data": {"dataset_name": "p.jsonl", "apply_chat_template": True}}),
        variant({"data": {"apply_chat_template": True}}),
        "data.apply_chat_template",
        "it applies to .jsonl datasets",
    ),
]
