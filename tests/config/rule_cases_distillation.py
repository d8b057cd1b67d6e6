"""Rule cases for the on-policy distillation rules (config/rules/distillation.py)."""

from __future__ import annotations

from typing import Any

from tests.config.rule_builders import ppo
from tests.helpers.configs import variant

TEACHERS = {"add": {"model_name": "builtin:tiny"}, "mul": {"model_name": "builtin:tiny"}}
OPD = {"grpo": {"adv_estimator": {"name": "opd"}}, "on_policy_distillation": {"teachers": TEACHERS}}

DISTILLATION_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    (
        "opd needs the teachers block",
        variant(OPD),
        variant({"grpo": {"adv_estimator": {"name": "opd"}}}),
        "on_policy_distillation",
        "is missing but grpo.adv_estimator.name is 'opd'",
    ),
    (
        "the teachers block needs opd",
        variant(OPD),
        variant({"on_policy_distillation": {"teachers": TEACHERS}}),
        "on_policy_distillation",
        "set grpo.adv_estimator.name: opd",
    ),
    (
        "the teachers block is GRPO's",
        variant(OPD),
        ppo({"on_policy_distillation": {"teachers": TEACHERS}}),
        "on_policy_distillation",
        "belongs to GRPO runs",
    ),
    (
        "opd is GRPO's",
        variant(OPD),
        ppo({"ppo": {"adv_estimator": {"name": "opd"}}}),
        "ppo.adv_estimator.name",
        "is 'opd'; a PPO run needs the gae estimator",
    ),
    (
        "opd names a teacher",
        variant(OPD),
        variant({"grpo": {"adv_estimator": {"name": "opd"}}, "on_policy_distillation": {"teachers": {}}}),
        "on_policy_distillation.teachers",
        "is empty",
    ),
    (
        "the default teacher is a teacher",
        variant(OPD, {"on_policy_distillation": {"default_teacher": "add"}}),
        variant(OPD, {"on_policy_distillation": {"default_teacher": "sub"}}),
        "on_policy_distillation.default_teacher",
        "is 'sub', which is not a teacher; name one of add, mul",
    ),
    (
        "without a route key every prompt needs the default teacher",
        variant(OPD, {"on_policy_distillation": {"route_key": None, "default_teacher": "mul"}}),
        variant(OPD, {"on_policy_distillation": {"route_key": None}}),
        "on_policy_distillation.default_teacher",
        "so no prompt has a teacher",
    ),
]
