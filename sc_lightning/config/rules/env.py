"""Validation rules for the environment block: what external-agent runs (``env.name: external``) need."""

from __future__ import annotations

from sc_lightning.config.report import Report, ties
from sc_lightning.config.schema import SCConfig


@ties(
    "env.name",
    "policy.generation.vllm_cfg.expose_http_server",
    "policy.generation.mcore_generation_config.expose_http_server",
    "async_rl.rollout_failure.rollout_timeout_s",
    "{algo}.val_period",
    "{algo}.val_at_start",
    "{algo}.val_at_end",
)
def external_agents(config: SCConfig, report: Report) -> None:
    """env.name external needs the HTTP endpoint, a rollout deadline, and no validation (agents score rollouts)."""
    if config.env.name != "external":
        return
    generation = config.policy.generation
    block = "vllm_cfg" if generation.backend == "vllm" else "mcore_generation_config"
    if not getattr(generation, block).expose_http_server:
        report.error(
            f"policy.generation.{block}.expose_http_server",
            "is false, but env.name external has agents drive the rollouts over the HTTP endpoint; set it true",
        )
    if config.async_rl.rollout_failure.rollout_timeout_s is None:
        report.error(
            "async_rl.rollout_failure.rollout_timeout_s",
            "is null, but with env.name external a prompt group waits for agents' rewards; set a deadline (e.g. "
            "600) so a lost agent fails its group instead of stalling the run",
        )
    if config.has_one_algorithm and config.algo.validates():
        name = config.algo_name
        report.error(
            f"{name}.val_period",
            f"validation scores completions with env.name's verifier, and env.name external has none (agents post "
            f"the rewards); set {name}.val_period: 0 and {name}.val_at_start / val_at_end: false",
        )


ENV_RULES = (external_agents,)
