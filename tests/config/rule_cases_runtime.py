"""Rule cases for the runtime rules (data plane, capacity, failures, checkpoints, recovery)."""

from __future__ import annotations

from typing import Any

from tests.config.rule_builders import CUSTOM, NON_COLOCATED, SNAPSHOTS, async_rl, ckpt, ppo, sampler
from tests.helpers.configs import variant

EXTERNAL = {  # env.name external with what it needs: the endpoint and a rollout deadline
    "env": {"name": "external"},
    "policy": {"generation": {"mcore_generation_config": {"expose_http_server": True}}},
    "async_rl": {"rollout_failure": {"rollout_timeout_s": 300}},
}

RUNTIME_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
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
        "stall beyond the drain deadline",
        variant({"async_rl": {"in_flight_weight_updates": False, "drain_timeout_s": 600}}),
        variant(
            {
                "async_rl": {
                    "in_flight_weight_updates": False,
                    "drain_timeout_s": 1200,
                    "stall_watchdog": {"stall_timeout_s": 1200},
                }
            }
        ),
        "async_rl.stall_watchdog.stall_timeout_s",
        "must exceed async_rl.drain_timeout_s (1200",
    ),
    (
        "drain outwaits a generation",
        variant({"async_rl": {"in_flight_weight_updates": True, "drain_timeout_s": 60}}),
        variant({"async_rl": {"in_flight_weight_updates": False, "drain_timeout_s": 60}}),
        "async_rl.drain_timeout_s",
        "below async_rl.rollout_failure.generation_timeout_s (600.0)",
    ),
    (
        "checkpoints save the data plane",
        variant(ckpt(enabled=True, save_data_plane=True)),
        variant(ckpt(enabled=True)),
        "checkpointing.save_data_plane",
        "lost on restart",
    ),
    (
        "data-plane snapshots need checkpoints",
        variant(ckpt(enabled=True, save_data_plane=True)),
        variant(ckpt(enabled=False, save_data_plane=True)),
        "checkpointing.save_data_plane",
        "checkpointing.enabled is false",
    ),
    (
        "the end-of-fit export needs checkpoints",
        variant(ckpt(enabled=True, save_data_plane=True, export_hf_at_end=True)),
        variant(ckpt(export_hf_at_end=True)),
        "checkpointing.export_hf_at_end",
        "the export is written from the fit's final bundle",
    ),
    (
        "ranking metric is a train or validation metric",
        variant(ckpt(metric_name="train:reward", keep_top_k=3)),
        variant(ckpt(metric_name="reward")),
        "checkpointing.metric_name",
        "use 'train:<metric>' (a logged train/<metric>, e.g. 'train:reward') or 'val:<metric>'",
    ),
    (
        "a validation ranking metric needs validation at every save_period step",
        variant(ckpt(metric_name="val:accuracy", keep_top_k=3, save_period=10), {"grpo": {"val_period": 5}}),
        variant(ckpt(metric_name="val:accuracy", keep_top_k=3, save_period=10), {"grpo": {"val_period": 4}}),
        "checkpointing.metric_name",
        "grpo.val_period is 4 and checkpointing.save_period 10: a bundle is ranked by the validation of its own step",
    ),
    (
        "a validation ranking metric needs validation",
        variant(ckpt(metric_name="val:reward", save_period=10), {"grpo": {"val_period": 10}}),
        variant(ckpt(metric_name="val:reward", save_period=10)),
        "checkpointing.metric_name",
        "grpo.val_period is 0",
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
        "excluded path leaves out no knob that shapes the rollouts",
        variant({"rollout_checkpointing": {"extra_fingerprint_excluded_paths": ["env.private.**", "*.log_dir"]}}),
        variant({"rollout_checkpointing": {"extra_fingerprint_excluded_paths": ["trainer.logger", "env.**"]}}),
        "rollout_checkpointing.extra_fingerprint_excluded_paths[1]",
        "'env.**' would leave out env.name, which decide the prompts, the answers or their rewards",
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
    (
        "external agents need the endpoint",
        variant(EXTERNAL),
        variant(EXTERNAL, {"policy": {"generation": {"mcore_generation_config": {"expose_http_server": False}}}}),
        "policy.generation.mcore_generation_config.expose_http_server",
        "env.name external has agents drive the rollouts over the HTTP endpoint",
    ),
    (
        "external agents need a rollout deadline",
        variant(EXTERNAL),
        variant(EXTERNAL, async_rl(rollout_failure={"rollout_timeout_s": None})),
        "async_rl.rollout_failure.rollout_timeout_s",
        "a lost agent fails its group",
    ),
    (
        "external agents cannot validate",
        variant(EXTERNAL),
        variant(EXTERNAL, {"grpo": {"val_at_end": True}}),
        "grpo.val_period",
        "env.name external has none",
    ),
]
