"""Every validation rule, each with a config that passes it and one that fails it, and the error text."""

from __future__ import annotations

from typing import Any

import pytest

from tests.config.helpers import PPO_COMPANION, errors_of, warnings_of
from tests.conftest import variant

NON_COLOCATED = {"policy": {"generation": {"colocated": {"enabled": False}}}}
CUSTOM = "tests.config.custom_samplers"


def ppo(*layers: dict[str, Any]) -> dict[str, Any]:
    """The tiny config turned into the spec's PPO run, with ``layers`` on top."""
    return variant(PPO_COMPANION, *layers)


def sampler(**knobs: Any) -> dict[str, Any]:
    return {"async_rl": {"sampler": knobs}}


def async_rl(**knobs: Any) -> dict[str, Any]:
    return {"async_rl": knobs}


def ckpt(**knobs: Any) -> dict[str, Any]:
    return {"checkpointing": knobs}


SNAPSHOTS = {
    "checkpointing": {"enabled": True, "save_data_plane": True, "save_period": 1},
    "rollout_checkpointing": {"snapshot_attempt_interval_s": 120, "keep_latest_k": 2},
    "token_capture": {"enabled": True},
}

# (rule, passing config, failing config, dotpath in the error, text in the error)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    ("one block: both", ppo(), variant({"ppo": PPO_COMPANION["ppo"]}), "ppo", "only one algorithm block"),
    ("one block: none", variant(), variant({"grpo": None}), "grpo", "needs a grpo: block"),
    (
        "legacy async_grpo",
        variant({"grpo": {"async_grpo": None}}),
        variant({"grpo": {"async_grpo": {"enabled": True, "max_trajectory_age_steps": 2}}}),
        "grpo.async_grpo",
        "max_lookahead_versions: 2",
    ),
    (
        "legacy async_ppo",
        ppo(),
        ppo({"ppo": {"async_ppo": {"enabled": True}}}),
        "ppo.async_ppo",
        "set ppo.async_ppo: null",
    ),
    ("epochs zero", variant(), variant({"grpo": {"max_num_epochs": 0}}), "grpo.max_num_epochs", "trains zero steps"),
    ("epochs -1", variant(), variant({"grpo": {"max_num_epochs": -1}}), "grpo.max_num_epochs", "no -1 convention"),
    (
        "val_period",
        variant({"grpo": {"val_period": 0}}),
        variant({"grpo": {"val_period": 5}}),
        "grpo.val_period",
        "not supported",
    ),
    ("val_at_start", variant(), variant({"grpo": {"val_at_start": True}}), "grpo.val_at_start", "not supported"),
    ("val_at_end", variant(), variant({"grpo": {"val_at_end": True}}), "grpo.val_at_end", "not supported"),
    (
        "dynamic sampling",
        variant(),
        variant({"grpo": {"use_dynamic_sampling": True}}),
        "grpo.use_dynamic_sampling",
        "not supported",
    ),
    (
        "reward shaping",
        variant({"grpo": {"reward_shaping": {"enabled": False, "overlong_buffer_length": 8}}}),
        variant({"grpo": {"reward_shaping": {"enabled": True}}}),
        "grpo.reward_shaping.enabled",
        "not supported",
    ),
    (
        "reward scaling",
        variant(),
        variant({"grpo": {"reward_scaling": {"enabled": True}}}),
        "grpo.reward_scaling.enabled",
        "not supported",
    ),
    (
        "GRPO with gae",
        variant(),
        variant({"grpo": {"adv_estimator": {"name": "gae"}}}),
        "grpo.adv_estimator.name",
        "needs a critic",
    ),
    (
        "PPO with grpo estimator",
        ppo(),
        ppo({"ppo": {"adv_estimator": {"name": "grpo"}}}),
        "ppo.adv_estimator.name",
        "gae",
    ),
    ("GRPO with value", variant(), variant({"value": {}}), "value", "belongs to PPO runs"),
    ("GRPO with value_loss_fn", variant(), variant({"value_loss_fn": {}}), "value_loss_fn", "belongs to PPO runs"),
    ("PPO without value", ppo(), ppo({"value": None}), "value", "required on a PPO run"),
    ("PPO without value_loss_fn", ppo(), ppo({"value_loss_fn": None}), "value_loss_fn", "required on a PPO run"),
    (
        "policy batch",
        variant(),
        variant({"policy": {"train_global_batch_size": 15}}),
        "policy.train_global_batch_size",
        "4 x 4 = 16",
    ),
    ("value batch", ppo(), ppo({"value": {"train_global_batch_size": 8}}), "value.train_global_batch_size", "= 16"),
    (
        "threshold within step",
        variant(NON_COLOCATED, async_rl(min_groups_for_streaming_train=2)),
        variant(NON_COLOCATED, async_rl(min_groups_for_streaming_train=5)),
        "async_rl.min_groups_for_streaming_train",
        "set <= 4",
    ),
    (
        "colocated only megatron",
        variant({"policy": {"generation": {"backend": "vllm", "colocated": {"enabled": False}}}}),
        variant({"policy": {"generation": {"backend": "vllm"}}}),
        "policy.generation.colocated.enabled",
        "only the megatron backend",
    ),
    (
        "colocated whole-step chunks",
        variant(async_rl(min_groups_for_streaming_train=4)),
        variant(async_rl(min_groups_for_streaming_train=2)),
        "async_rl.min_groups_for_streaming_train",
        "colocated generation",
    ),
    (
        "vllm async engine",
        variant({"policy": {"generation": {"backend": "vllm", "colocated": {"enabled": False}}}}),
        variant(
            {
                "policy": {
                    "generation": {
                        "backend": "vllm",
                        "colocated": {"enabled": False},
                        "vllm_cfg": {"async_engine": False},
                    }
                }
            }
        ),
        "policy.generation.vllm_cfg.async_engine",
        "async engine",
    ),
    (
        "megatron trainer",
        variant(),
        variant({"policy": {"megatron_cfg": {"enabled": False}}}),
        "policy.megatron_cfg.enabled",
        "only trainer",
    ),
    (
        "megatron critic",
        ppo(),
        ppo({"value": {"megatron_cfg": {"enabled": False}}}),
        "value.megatron_cfg.enabled",
        "Megatron",
    ),
    (
        "sequence parallel needs TP",
        variant({"policy": {"megatron_cfg": {"sequence_parallel": True, "tensor_model_parallel_size": 2}}}),
        variant({"policy": {"megatron_cfg": {"sequence_parallel": True}}}),
        "policy.megatron_cfg.sequence_parallel",
        "tensor_model_parallel_size 1",
    ),
    ("vlm", variant(), variant({"policy": {"is_vlm": True}}), "policy.is_vlm", "not supported"),
    (
        "IS for in_order lookahead",
        variant(sampler(max_lookahead_versions=0), {"loss_fn": {"use_importance_sampling_correction": False}}),
        variant(
            sampler(max_lookahead_versions=1),
            async_rl(max_buffered_rollouts=8),
            {"loss_fn": {"use_importance_sampling_correction": False}},
        ),
        "loss_fn.use_importance_sampling_correction",
        "max_lookahead_versions",
    ),
    (
        "IS for weight_fifo",
        variant(
            sampler(name="weight_fifo", max_staleness_versions=0),
            {"loss_fn": {"use_importance_sampling_correction": False}},
        ),
        variant(
            sampler(name="weight_fifo"),
            async_rl(max_buffered_rollouts=8),
            {"loss_fn": {"use_importance_sampling_correction": False}},
        ),
        "loss_fn.use_importance_sampling_correction",
        "weight_fifo sampler",
    ),
    (
        "IS for windowed",
        variant(
            sampler(name="windowed", max_staleness_versions=0),
            {"loss_fn": {"use_importance_sampling_correction": False}},
        ),
        variant(sampler(name="windowed"), {"loss_fn": {"use_importance_sampling_correction": False}}),
        "loss_fn.use_importance_sampling_correction",
        "windowed sampler",
    ),
    (
        "IS for ready_first",
        variant(sampler(name="ready_first", max_staleness_versions=0)),
        variant(
            sampler(name="ready_first", max_staleness_versions=0),
            {"loss_fn": {"use_importance_sampling_correction": False}},
        ),
        "loss_fn.use_importance_sampling_correction",
        "ready_first sampler",
    ),
    (
        "ready_first ratio",
        variant(sampler(name="ready_first", max_staleness_versions=0)),
        variant(sampler(name="ready_first", max_staleness_versions=0), {"loss_fn": {"force_on_policy_ratio": True}}),
        "loss_fn.force_on_policy_ratio",
        "prev_logprobs",
    ),
    (
        "TIS needs its ratio",
        variant({"loss_fn": {"truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 2.0}}),
        variant({"loss_fn": {"truncated_importance_sampling_type": "tis"}}),
        "loss_fn.truncated_importance_sampling_ratio",
        "required",
    ),
    (
        "TIS needs IS",
        variant({"loss_fn": {"truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 2.0}}),
        variant(
            sampler(max_lookahead_versions=0),
            {
                "loss_fn": {
                    "use_importance_sampling_correction": False,
                    "truncated_importance_sampling_type": "tis",
                    "truncated_importance_sampling_ratio": 2.0,
                }
            },
        ),
        "loss_fn.truncated_importance_sampling_type",
        "use_importance_sampling_correction: true",
    ),
    (
        "icepop needs min",
        variant(
            {
                "loss_fn": {
                    "truncated_importance_sampling_type": "icepop",
                    "truncated_importance_sampling_ratio": 2.0,
                    "truncated_importance_sampling_ratio_min": 0.5,
                }
            }
        ),
        variant(
            {"loss_fn": {"truncated_importance_sampling_type": "icepop", "truncated_importance_sampling_ratio": 2.0}}
        ),
        "loss_fn.truncated_importance_sampling_ratio_min",
        "required",
    ),
    (
        "TIS min <= max",
        variant(
            {
                "loss_fn": {
                    "truncated_importance_sampling_type": "icepop",
                    "truncated_importance_sampling_ratio": 2.0,
                    "truncated_importance_sampling_ratio_min": 0.5,
                }
            }
        ),
        variant(
            {
                "loss_fn": {
                    "truncated_importance_sampling_type": "icepop",
                    "truncated_importance_sampling_ratio": 2.0,
                    "truncated_importance_sampling_ratio_min": 3.0,
                }
            }
        ),
        "loss_fn.truncated_importance_sampling_ratio_min",
        "exceeds",
    ),
    (
        "seq-mask-tis without GSPO",
        variant(
            {
                "loss_fn": {
                    "truncated_importance_sampling_type": "seq-mask-tis",
                    "truncated_importance_sampling_ratio": 2.0,
                    "truncated_importance_sampling_ratio_min": 0.5,
                }
            }
        ),
        variant(
            {
                "loss_fn": {
                    "truncated_importance_sampling_type": "seq-mask-tis",
                    "truncated_importance_sampling_ratio": 2.0,
                    "truncated_importance_sampling_ratio_min": 0.5,
                    "sequence_level_importance_ratios": True,
                    "token_level_loss": False,
                }
            }
        ),
        "loss_fn.truncated_importance_sampling_type",
        "sequence_level_importance_ratios",
    ),
    (
        "TIS bounds need a type",
        variant(),
        variant({"loss_fn": {"truncated_importance_sampling_ratio": 2.0}}),
        "loss_fn.truncated_importance_sampling_type",
        "bounds are set",
    ),
    (
        "KL needs reference logprobs",
        variant({"grpo": {"skip_reference_policy_logprobs_calculation": True}}),
        variant(
            {
                "grpo": {"skip_reference_policy_logprobs_calculation": True},
                "loss_fn": {"reference_policy_kl_penalty": 0.01},
            }
        ),
        "loss_fn.reference_policy_kl_penalty",
        "skip_reference_policy_logprobs_calculation is true",
    ),
    (
        "GSPO needs sequence-level loss",
        variant({"loss_fn": {"sequence_level_importance_ratios": True, "token_level_loss": False}}),
        variant({"loss_fn": {"sequence_level_importance_ratios": True}}),
        "loss_fn.sequence_level_importance_ratios",
        "token_level_loss: false",
    ),
    ("PPO in_order only", ppo(), ppo(sampler(name="windowed")), "async_rl.sampler.name", "only in_order"),
    (
        "PPO skip budget",
        ppo(),
        ppo({"async_rl": {"rollout_failure": {"max_skipped_prompts": 1}}}),
        "async_rl.rollout_failure.max_skipped_prompts",
        "PPO needs 0",
    ),
    (
        "PPO drop budget",
        ppo(),
        ppo({"async_rl": {"rollout_failure": {"max_consecutive_dropped_prompts": 1}}}),
        "async_rl.rollout_failure.max_consecutive_dropped_prompts",
        "PPO needs 0",
    ),
    (
        "PPO whole-step chunks",
        ppo(NON_COLOCATED),
        ppo(NON_COLOCATED, async_rl(min_groups_for_streaming_train=2)),
        "async_rl.min_groups_for_streaming_train",
        "a PPO step is one chunk",
    ),
    (
        "PPO offload",
        ppo(),
        ppo({"policy": {"offload_optimizer_for_logprob": False}}),
        "policy.offload_optimizer_for_logprob",
        "critic runs",
    ),
    (
        "PPO epochs >= 1",
        ppo({"ppo": {"ppo_epochs": 2}}),
        ppo({"ppo": {"ppo_epochs": 0}}),
        "ppo.ppo_epochs",
        "must be >= 1",
    ),
    (
        "PPO critic epochs >= 1",
        ppo({"ppo": {"critic_ppo_epochs": 3}}),
        ppo({"ppo": {"critic_ppo_epochs": 0}}),
        "ppo.critic_ppo_epochs",
        "must be >= 1",
    ),
    (
        "warm-up needs a warm-up",
        ppo(
            {"ppo": {"policy_training_start_step": 5}},
            sampler(max_lookahead_versions=0, warmup_lookahead_versions=1),
            async_rl(max_buffered_rollouts=8),
        ),
        ppo(sampler(max_lookahead_versions=0, warmup_lookahead_versions=1), async_rl(max_buffered_rollouts=8)),
        "async_rl.sampler.warmup_lookahead_versions",
        "policy_training_start_step is 0",
    ),
    (
        "warm-up >= lookahead",
        ppo(
            {"ppo": {"policy_training_start_step": 5}},
            sampler(max_lookahead_versions=1, warmup_lookahead_versions=1),
            async_rl(max_buffered_rollouts=8),
        ),
        ppo(
            {"ppo": {"policy_training_start_step": 5}},
            sampler(max_lookahead_versions=1, warmup_lookahead_versions=0),
            async_rl(max_buffered_rollouts=8),
        ),
        "async_rl.sampler.warmup_lookahead_versions",
        "below max_lookahead_versions",
    ),
    (
        "warm-up is a PPO knob",
        variant(),
        variant(sampler(warmup_lookahead_versions=1), async_rl(max_buffered_rollouts=8)),
        "async_rl.sampler.warmup_lookahead_versions",
        "PPO critic-warm-up knob",
    ),
    (
        "data plane enabled",
        variant(),
        variant({"data_plane": {"enabled": False}}),
        "data_plane.enabled",
        "requires the data plane",
    ),
    (
        "capacity in_order",
        variant(sampler(max_lookahead_versions=1), async_rl(max_buffered_rollouts=8)),
        variant(sampler(max_lookahead_versions=1), async_rl(max_buffered_rollouts=7)),
        "async_rl.max_buffered_rollouts",
        "required capacity (8 = grpo.num_prompts_per_step x (async_rl.sampler.max_lookahead_versions + 1))",
    ),
    (
        "capacity weight_fifo",
        variant(sampler(name="weight_fifo", max_staleness_versions=2), async_rl(max_buffered_rollouts=12)),
        variant(sampler(name="weight_fifo", max_staleness_versions=2), async_rl(max_buffered_rollouts=11)),
        "async_rl.max_buffered_rollouts",
        "weight_fifo sampler's required capacity (12",
    ),
    (
        "capacity ready_first",
        variant(sampler(name="ready_first"), async_rl(max_buffered_rollouts=8)),
        variant(sampler(name="ready_first"), async_rl(max_buffered_rollouts=5)),
        "async_rl.max_buffered_rollouts",
        "deadlock",
    ),
    (
        "capacity windowed",
        variant(
            NON_COLOCATED, sampler(name="windowed"), async_rl(max_buffered_rollouts=2, min_groups_for_streaming_train=2)
        ),
        variant(
            NON_COLOCATED, sampler(name="windowed"), async_rl(max_buffered_rollouts=1, min_groups_for_streaming_train=2)
        ),
        "async_rl.max_buffered_rollouts",
        "async_rl.min_groups_for_streaming_train",
    ),
    (
        "capacity sized from warm-up",
        ppo(
            {"ppo": {"policy_training_start_step": 5}},
            sampler(max_lookahead_versions=0, warmup_lookahead_versions=2),
            async_rl(max_buffered_rollouts=12),
        ),
        ppo(
            {"ppo": {"policy_training_start_step": 5}},
            sampler(max_lookahead_versions=0, warmup_lookahead_versions=2),
            async_rl(max_buffered_rollouts=8),
        ),
        "async_rl.max_buffered_rollouts",
        "warmup_lookahead_versions + 1",
    ),
    (
        "custom target format",
        variant(sampler(name="custom", target=f"{CUSTOM}:CapableSampler")),
        variant(sampler(name="custom", target="no_colon_here")),
        "async_rl.sampler.target",
        'must look like "package.module:ClassName"',
    ),
    (
        "custom target imports",
        variant(sampler(name="custom", target=f"{CUSTOM}:CapableSampler")),
        variant(sampler(name="custom", target="no_such_package.samplers:Mine")),
        "async_rl.sampler.target",
        "cannot import module 'no_such_package.samplers'",
    ),
    (
        "custom target is a class",
        variant(sampler(name="custom", target=f"{CUSTOM}:CapableSampler")),
        variant(sampler(name="custom", target=f"{CUSTOM}:NOT_A_CLASS")),
        "async_rl.sampler.target",
        "is not a class",
    ),
    (
        "custom capability is a boolean",
        variant(sampler(name="custom", target=f"{CUSTOM}:NoCheckpointSampler")),
        variant(sampler(name="custom", target=f"{CUSTOM}:PropertyFlagSampler")),
        "async_rl.sampler.target",
        "boolean class attribute",
    ),
    (
        "back-off cap",
        variant({"async_rl": {"rollout_failure": {"max_backoff_s": 1.0, "backoff_base_s": 1.0}}}),
        variant({"async_rl": {"rollout_failure": {"max_backoff_s": 0.5, "backoff_base_s": 1.0}}}),
        "async_rl.rollout_failure.max_backoff_s",
        "below backoff_base_s",
    ),
    (
        "replace needs attempts",
        variant({"async_rl": {"rollout_failure": {"on_dropped_prompt": "replace", "replacement_reserve_prompts": 4}}}),
        variant(
            {
                "async_rl": {
                    "rollout_failure": {
                        "on_dropped_prompt": "replace",
                        "replacement_reserve_prompts": 4,
                        "max_replacement_attempts": 0,
                    }
                }
            }
        ),
        "async_rl.rollout_failure.max_replacement_attempts",
        "0 means shrink",
    ),
    (
        "replace needs a reserve",
        variant({"async_rl": {"rollout_failure": {"on_dropped_prompt": "replace", "replacement_reserve_prompts": 4}}}),
        variant({"async_rl": {"rollout_failure": {"on_dropped_prompt": "replace"}}}),
        "async_rl.rollout_failure.replacement_reserve_prompts",
        "set >= 1",
    ),
    (
        "drop budget needs stamps",
        variant(
            sampler(name="custom", target=f"{CUSTOM}:CapableSampler"),
            {"async_rl": {"rollout_failure": {"max_skipped_prompts": 1}}},
        ),
        variant(sampler(name="windowed"), {"async_rl": {"rollout_failure": {"max_skipped_prompts": 1}}}),
        "async_rl.rollout_failure.max_skipped_prompts",
        "stamps no target step",
    ),
    (
        "stall beyond interval",
        variant({"async_rl": {"stall_watchdog": {"interval_s": 10, "stall_timeout_s": 900}}}),
        variant({"async_rl": {"stall_watchdog": {"interval_s": 900, "stall_timeout_s": 900}}}),
        "async_rl.stall_watchdog.stall_timeout_s",
        "must exceed interval_s",
    ),
    (
        "stall beyond deadlines",
        variant(
            {
                "async_rl": {
                    "rollout_failure": {"generation_timeout_s": None},
                    "stall_watchdog": {"stall_timeout_s": 121},
                }
            }
        ),
        variant(
            {"async_rl": {"rollout_failure": {"generation_timeout_s": 600}, "stall_watchdog": {"stall_timeout_s": 600}}}
        ),
        "async_rl.stall_watchdog.stall_timeout_s",
        "generation_timeout_s (600.0)",
    ),
    (
        "checkpoints save the data plane",
        variant(ckpt(enabled=True, save_data_plane=True)),
        variant(ckpt(enabled=True)),
        "checkpointing.save_data_plane",
        "lost on restart",
    ),
    (
        "data-plane snapshots need simple",
        variant(ckpt(enabled=True, save_data_plane=True)),
        variant(ckpt(enabled=True, save_data_plane=True), {"data_plane": {"backend": "memory"}}),
        "checkpointing.save_data_plane",
        "set it to 'simple'",
    ),
    (
        "data-plane snapshots need checkpoints",
        variant(ckpt(enabled=True, save_data_plane=True)),
        variant(ckpt(enabled=False, save_data_plane=True)),
        "checkpointing.save_data_plane",
        "checkpointing.enabled is false",
    ),
    (
        "ranking metric is a train metric",
        variant(ckpt(metric_name="train:reward", keep_top_k=3)),
        variant(ckpt(metric_name="val:reward")),
        "checkpointing.metric_name",
        "train:<metric>",
    ),
    ("top-k needs a metric", variant(), variant(ckpt(keep_top_k=3)), "checkpointing.keep_top_k", "metric_name"),
    (
        "snapshots need token capture",
        variant(SNAPSHOTS),
        variant(SNAPSHOTS, {"token_capture": {"enabled": False}}),
        "token_capture.enabled",
        "periodic rollout snapshots",
    ),
    (
        "snapshots need data-plane checkpoints",
        variant(SNAPSHOTS),
        variant(SNAPSHOTS, ckpt(save_data_plane=False)),
        "checkpointing.save_data_plane",
        "periodic rollout snapshots",
    ),
    (
        "snapshots need checkpoints",
        variant(SNAPSHOTS),
        variant(SNAPSHOTS, ckpt(enabled=False)),
        "checkpointing.enabled",
        "periodic rollout snapshots",
    ),
    (
        "snapshots need simple",
        variant(SNAPSHOTS),
        variant(SNAPSHOTS, {"data_plane": {"backend": "memory"}}),
        "data_plane.backend",
        "periodic rollout snapshots",
    ),
    (
        "snapshots need training claims",
        variant(SNAPSHOTS, sampler(name="custom", target=f"{CUSTOM}:CapableSampler")),
        variant(SNAPSHOTS, sampler(name="custom", target=f"{CUSTOM}:ClaimlessSampler")),
        "async_rl.sampler.target",
        "supports_training_claims = True",
    ),
    (
        "excluded path is specific",
        variant({"rollout_checkpointing": {"extra_fingerprint_excluded_paths": ["env.private.*.log_dir", "a.**"]}}),
        variant({"rollout_checkpointing": {"extra_fingerprint_excluded_paths": ["ok.path", "**"]}}),
        "rollout_checkpointing.extra_fingerprint_excluded_paths[1]",
        "whole config",
    ),
    (
        "excluded path has no empty segment",
        variant(),
        variant({"rollout_checkpointing": {"extra_fingerprint_excluded_paths": ["a..b"]}}),
        "rollout_checkpointing.extra_fingerprint_excluded_paths[0]",
        "empty segment",
    ),
    (
        "excluded path is trimmed",
        variant(),
        variant({"rollout_checkpointing": {"extra_fingerprint_excluded_paths": [" a.b"]}}),
        "rollout_checkpointing.extra_fingerprint_excluded_paths[0]",
        "surrounding spaces",
    ),
    (
        "prompt_group needs capture",
        variant({"rollout_recovery": {"default_granularity": "prompt_group"}, "token_capture": {"enabled": True}}),
        variant({"rollout_recovery": {"default_granularity": "prompt_group"}}),
        "rollout_recovery",
        "token_capture.enabled is false",
    ),
    (
        "overrides need capture",
        variant(
            {
                "rollout_recovery": {"agent_granularity_overrides": {"coder": "prompt_group"}},
                "token_capture": {"enabled": True},
            }
        ),
        variant({"rollout_recovery": {"task_source_granularity_overrides": {"math": "prompt_group"}}}),
        "rollout_recovery",
        "token_capture.enabled is false",
    ),
]


@pytest.mark.parametrize(("rule", "passing", "failing", "path", "text"), CASES, ids=[c[0] for c in CASES])
def test_rule_passes_and_fails(rule: str, passing: dict, failing: dict, path: str, text: str) -> None:
    assert errors_of(passing) == [], f"{rule}: the passing config was rejected"
    errors = errors_of(failing)
    matching = [e for e in errors if path in e.split(": ", 1)[0].split(", ") and text in e]
    assert matching, f"{rule}: expected an error at {path!r} containing {text!r}, got {errors}"


def test_every_rule_function_has_a_failing_case() -> None:
    """Each rule, run alone, rejects at least one failing config above: a new rule needs a case here."""
    from sc_lightning.cli import LIGHTNING_KEYS
    from sc_lightning.config import ConfigError, load_config
    from sc_lightning.config.report import Report
    from sc_lightning.config.rules_algo import ALGORITHM_RULES
    from sc_lightning.config.rules_runtime import RUNTIME_RULES

    configs = []
    for case in CASES:
        try:
            configs.append(load_config(case[2], extra_top_level=LIGHTNING_KEYS))
        except ConfigError:
            continue  # a loader-level rule (type or bound), covered by the case itself
    for rule in (*ALGORITHM_RULES, *RUNTIME_RULES):
        reports = [Report() for _ in configs]
        for config, report in zip(configs, reports, strict=True):
            rule(config, report)
        assert any(report.errors for report in reports), f"no failing case exercises {rule.__name__}"


def test_all_errors_are_reported_at_once() -> None:
    failing = variant(
        {"grpo": {"max_num_epochs": 0, "val_at_end": True}},
        {"policy": {"train_global_batch_size": 3}},
        {"data_plane": {"enabled": False}},
    )
    errors = errors_of(failing)
    assert [e.split(":")[0] for e in errors] == [
        "grpo.max_num_epochs",
        "grpo.val_at_end",
        "policy.train_global_batch_size",
        "data_plane.enabled",
    ]


WARNING_CASES = [
    (
        "floor leaves no room to shrink",
        {"async_rl": {"rollout_failure": {"max_skipped_prompts": 1}}},
        "async_rl.rollout_failure.min_step_batch_fraction",
        "ceil(4 x 0.9) = 4",
    ),
    (
        "replace without stamps",
        variant(
            sampler(name="windowed"),
            {"async_rl": {"rollout_failure": {"on_dropped_prompt": "replace", "replacement_reserve_prompts": 1}}},
        ),
        "async_rl.rollout_failure.on_dropped_prompt",
        "does nothing with the windowed sampler",
    ),
    (
        "reserve larger than a step",
        {"async_rl": {"rollout_failure": {"on_dropped_prompt": "replace", "replacement_reserve_prompts": 9}}},
        "async_rl.rollout_failure.replacement_reserve_prompts",
        "exceeds a step's 4 prompts",
    ),
    (
        "custom sampler without buffer checkpoints",
        variant(sampler(name="custom", target=f"{CUSTOM}:NoCheckpointSampler"), ckpt(enabled=True)),
        "async_rl.sampler.target",
        "not restored on resume",
    ),
]


@pytest.mark.parametrize(("case", "layer", "path", "text"), WARNING_CASES, ids=[c[0] for c in WARNING_CASES])
def test_warnings(case: str, layer: dict, path: str, text: str) -> None:
    raw = variant(layer)
    assert errors_of(raw) == []
    assert any(w.startswith(f"{path}:") and text in w for w in warnings_of(raw)), warnings_of(raw)
    assert not any(w.startswith(f"{path}:") for w in warnings_of(variant()))
