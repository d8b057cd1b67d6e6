"""Validation rules for on-policy distillation (``grpo.adv_estimator.name: opd`` with ``on_policy_distillation:``)."""

from __future__ import annotations

from sc_lightning.config.report import Report, ties
from sc_lightning.config.schema import SCConfig

BLOCK = "on_policy_distillation"


@ties("{algo}.adv_estimator.name", BLOCK, f"{BLOCK}.teachers")
def distillation_has_teachers(config: SCConfig, report: Report) -> None:
    """The opd estimator needs the teachers block (with a teacher), and the block needs the opd estimator on GRPO."""
    if not config.has_one_algorithm:
        return
    opd = config.algo.adv_estimator.name == "opd"
    block = config.on_policy_distillation
    if config.ppo is not None and block is not None:
        report.error(BLOCK, "belongs to GRPO runs (adv_estimator.name: opd); delete it from this PPO config")
    elif opd and block is None:
        report.error(BLOCK, "is missing but grpo.adv_estimator.name is 'opd'; add the block with its teachers")
    elif block is not None and not opd:
        report.error(
            BLOCK,
            f"is set but {config.algo_name}.adv_estimator.name is {config.algo.adv_estimator.name!r}, so no teacher "
            "would be used; set grpo.adv_estimator.name: opd or delete the block",
        )
    if opd and block is not None and not block.teachers:
        report.error(f"{BLOCK}.teachers", "is empty; name at least one teacher (alias: {model_name: ...})")


@ties(f"{BLOCK}.route_key", f"{BLOCK}.default_teacher", f"{BLOCK}.teachers")
def routes_name_teachers(config: SCConfig, report: Report) -> None:
    """default_teacher is one of the teachers; with no route_key every prompt needs the default teacher."""
    block = config.on_policy_distillation
    if block is None or not block.teachers:
        return
    known = ", ".join(sorted(block.teachers))
    if block.default_teacher is not None and block.default_teacher not in block.teachers:
        report.error(
            f"{BLOCK}.default_teacher",
            f"is {block.default_teacher!r}, which is not a teacher; name one of {known} (or null)",
        )
    if block.route_key is None and block.default_teacher is None:
        report.error(
            f"{BLOCK}.default_teacher",
            f"is null with route_key null, so no prompt has a teacher; name one of {known} or set route_key",
        )


DISTILLATION_RULES = (distillation_has_teachers, routes_name_teachers)
