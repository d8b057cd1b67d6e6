"""Rule cases for the multi-turn rules (config/rules/multiturn.py)."""

from __future__ import annotations

from typing import Any

from tests.config.rule_builders import ppo
from tests.helpers.configs import variant

SHAPING = {"enabled": True, "overlong_buffer_length": 2, "overlong_buffer_penalty": 1.0}
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
        "multi-turn overlong shaping names its response length",
        variant(MULTITURN, {"grpo": {"reward_shaping": {**SHAPING, "max_response_length": 16}}}),
        variant(MULTITURN, {"grpo": {"reward_shaping": SHAPING}}),
        "grpo.reward_shaping.max_response_length",
        "is null in a multi-turn run",
    ),
    (
        "multi-turn without validation",
        variant(MULTITURN),
        variant(MULTITURN, {"grpo": {"val_period": 5}, "data": {"val_dataset_name": "v.jsonl"}}),
        "grpo.val_period",
        "set val_period: 0",
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
        "use calculator, or a dataset file",
    ),
    (
        "multi-turn prompts are chat-rendered (parquet)",
        variant(MULTITURN, {"data": {"dataset_name": "p.parquet", "apply_chat_template": True}}),
        variant(MULTITURN, {"data": {"dataset_name": "p.parquet"}}),
        "data.apply_chat_template",
        "set data.apply_chat_template: true",
    ),
    (
        "the chat template applies to dataset files",
        variant({"data": {"dataset_name": "saved/train", "apply_chat_template": True}}),
        variant({"data": {"apply_chat_template": True}}),
        "data.apply_chat_template",
        "it applies to dataset files",
    ),
    (
        "chat prompts open no conversation",
        variant({"data": {"dataset_name": "p.parquet", "messages_key": "messages"}}),
        variant(MULTITURN, {"data": {"dataset_name": "p.parquet", "messages_key": "messages"}}),
        "data.messages_key",
        "set data.messages_key: null",
    ),
    (
        "chat prompts reach no external agent",
        variant({"data": {"dataset_name": "p.parquet", "messages_key": "messages"}}),
        variant({"env": {"name": "external"}, "data": {"dataset_name": "p.parquet", "messages_key": "messages"}}),
        "data.messages_key",
        "opens each conversation with the prompt's text",
    ),
    (
        "a system prompt needs the chat template",
        variant({"data": {"dataset_name": "p.jsonl", "apply_chat_template": True, "system_prompt": "Add."}}),
        variant({"data": {"dataset_name": "p.jsonl", "system_prompt": "Add."}}),
        "data.system_prompt",
        "data.apply_chat_template is false",
    ),
    (
        "a system prompt leaves chat prompts as they are",
        variant({"data": {"dataset_name": "p.jsonl", "messages_key": "messages"}}),
        variant({"data": {"dataset_name": "p.jsonl", "messages_key": "messages", "system_prompt": "Add."}}),
        "data.system_prompt",
        "chat prompts carry their own system message",
    ),
    (
        "a system prompt opens no multi-turn conversation",
        variant(MULTITURN, {"data": {"dataset_name": "p.jsonl", "apply_chat_template": True}}),
        variant(MULTITURN, {"data": {"dataset_name": "p.jsonl", "apply_chat_template": True, "system_prompt": "x"}}),
        "data.system_prompt",
        "opens each conversation with the prompt's text alone",
    ),
]
