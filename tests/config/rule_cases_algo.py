"""Rule cases for the algorithm, model, generation and loss rules: (rule, passing, failing, dotpath, text).

A table of data (past 400 lines), one row per case; its sibling files hold the other rule families.
"""

from __future__ import annotations

from typing import Any

from tests.config.helpers import PPO_COMPANION
from tests.config.rule_builders import NON_COLOCATED, VLLM, async_rl, ppo, sampler
from tests.helpers.configs import variant

SEPARATE_ENGINE = {"generation": {"colocated": {"enabled": False}}}  # the tests' base config colocates the engine

ALGORITHM_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
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
        "validation needs a validation set",
        variant({"grpo": {"val_period": 5}, "data": {"dataset_name": "prompts.jsonl", "val_dataset_name": "v.jsonl"}}),
        variant({"grpo": {"val_period": 5}, "data": {"dataset_name": "prompts.jsonl"}}),
        "data.val_dataset_name",
        "no builtin validation set",
    ),
    (
        "val_at_end needs a validation set",
        variant({"grpo": {"val_at_end": True}}),
        variant({"grpo": {"val_at_end": True}, "data": {"dataset_name": "prompts.jsonl"}}),
        "data.val_dataset_name",
        "set the path of a dataset file",
    ),
    ("val_period negative", variant(), variant({"grpo": {"val_period": -1}}), "grpo.val_period", ">= 0"),
    ("val_batch_size zero", variant(), variant({"grpo": {"val_batch_size": 0}}), "grpo.val_batch_size", ">= 1"),
    ("max_val_samples zero", variant(), variant({"grpo": {"max_val_samples": 0}}), "grpo.max_val_samples", ">= 1"),
    (
        "dynamic sampling: on PPO",
        ppo(),
        ppo({"ppo": {"use_dynamic_sampling": True}}),
        "ppo.use_dynamic_sampling",
        "GRPO groups",
    ),
    (
        "dynamic sampling: over-generation",
        variant({"grpo": {"use_dynamic_sampling": True, "batch_multiplier": 1}}),
        variant({"grpo": {"use_dynamic_sampling": True, "batch_multiplier": 3}}),
        "grpo.batch_multiplier",
        "over-generation is not supported",
    ),
    (
        "dynamic sampling: groups of one",
        variant({"grpo": {"use_dynamic_sampling": True}}),
        variant({"grpo": {"use_dynamic_sampling": True, "num_generations_per_prompt": 1}}),
        "grpo.use_dynamic_sampling",
        "num_generations_per_prompt >= 2",
    ),
    (
        "reward shaping without its buffer",
        variant(
            {"grpo": {"reward_shaping": {"enabled": True, "overlong_buffer_length": 2, "overlong_buffer_penalty": 1}}}
        ),
        variant({"grpo": {"reward_shaping": {"enabled": True, "overlong_buffer_penalty": 1}}}),
        "grpo.reward_shaping.overlong_buffer_length",
        "is null but reward_shaping.enabled is true",
    ),
    (
        "reward shaping buffer longer than the limit",
        variant(
            {"grpo": {"reward_shaping": {"enabled": True, "overlong_buffer_length": 4, "overlong_buffer_penalty": 1}}}
        ),
        variant(
            {"grpo": {"reward_shaping": {"enabled": True, "overlong_buffer_length": 5, "overlong_buffer_penalty": 1}}}
        ),
        "grpo.reward_shaping.overlong_buffer_length",
        "(5) exceeds the length the penalty is measured against (4",
    ),
    (
        "reward shaping with a negative penalty",
        variant(
            {"grpo": {"reward_shaping": {"enabled": True, "overlong_buffer_length": 2, "overlong_buffer_penalty": 0}}}
        ),
        variant(
            {"grpo": {"reward_shaping": {"enabled": True, "overlong_buffer_length": 2, "overlong_buffer_penalty": -1}}}
        ),
        "grpo.reward_shaping.overlong_buffer_penalty",
        "give a number >= 0",
    ),
    (
        "reward scaling of an empty range",
        variant({"grpo": {"reward_scaling": {"enabled": True, "source_min": -1.0, "source_max": 1.0}}}),
        variant({"grpo": {"reward_scaling": {"enabled": True, "source_min": 1.0, "source_max": 1.0}}}),
        "grpo.reward_scaling.source_max",
        "must exceed grpo.reward_scaling.source_min",
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
        "vllm without truncation (top_p)",
        variant({"policy": {"generation": {"backend": "vllm", "colocated": {"enabled": False}}}}),
        variant({"policy": {"generation": {"backend": "vllm", "colocated": {"enabled": False}, "top_p": 0.9}}}),
        "policy.generation.top_p",
        "logprobs of the truncated distribution",
    ),
    (
        "vllm without truncation (top_k)",
        variant({"policy": {"generation": {"backend": "megatron", "top_k": 5}}}),
        variant({"policy": {"generation": {"backend": "vllm", "colocated": {"enabled": False}, "top_k": 5}}}),
        "policy.generation.top_k",
        "logprobs of the truncated distribution",
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
        "prompts fit the context",
        variant({"data": {"max_prompt_length": 31}}),
        variant({"data": {"max_prompt_length": 32}}),
        "data.max_prompt_length",
        "(32) leaves no room for a completion in the 32-token context (policy.max_total_sequence_length)",
    ),
    (
        "prompts fit vLLM's context",
        variant(VLLM, {"policy": {"generation": {"vllm_cfg": {"max_model_len": 17}}}}),
        variant(VLLM, {"policy": {"generation": {"vllm_cfg": {"max_model_len": 16}}}}),
        "data.max_prompt_length",
        "16-token context (policy.generation.vllm_cfg.max_model_len)",
    ),
    (
        "decay floor above the peak",
        variant({"policy": {"optimizer": {"lr": 1e-3, "min_lr": 1e-4, "lr_decay_style": "cosine"}}}),
        variant({"policy": {"optimizer": {"lr": 1e-3, "min_lr": 2e-3, "lr_decay_style": "linear"}}}),
        "policy.optimizer.min_lr",
        "so the rate would rise",
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
        "sequence parallelism needs tensor parallelism",
        variant(
            {
                "policy": {
                    "megatron_cfg": {"sequence_parallel": True, "tensor_model_parallel_size": 2},
                    **SEPARATE_ENGINE,
                }
            }
        ),
        variant({"policy": {"megatron_cfg": {"sequence_parallel": True}, **SEPARATE_ENGINE}}),
        "policy.megatron_cfg.sequence_parallel",
        "is true but tensor_model_parallel_size is 1",
    ),
    (
        "a colocated Megatron engine needs the trainer's parallel state at TP = PP = 1",
        variant({"policy": {"megatron_cfg": {"tensor_model_parallel_size": 2}, **SEPARATE_ENGINE}}),
        variant({"policy": {"megatron_cfg": {"tensor_model_parallel_size": 2}}}),
        "policy.megatron_cfg.tensor_model_parallel_size",
        "the colocated Megatron engine runs in the trainer's process",
    ),
    (
        "the critic splits like the policy (pipeline)",
        ppo(
            {
                "policy": {"megatron_cfg": {"pipeline_model_parallel_size": 2}, **SEPARATE_ENGINE},
                "value": {"megatron_cfg": {"pipeline_model_parallel_size": 2}},
                "loss_fn": {"reference_policy_kl_penalty": 0.01},
            }
        ),
        ppo({"value": {"megatron_cfg": {"pipeline_model_parallel_size": 2}}}),
        "value.megatron_cfg.pipeline_model_parallel_size",
        "is 2 but policy.megatron_cfg.pipeline_model_parallel_size is 1",
    ),
    (
        "the critic splits like the policy (tensor)",
        ppo(),
        ppo({"value": {"megatron_cfg": {"tensor_model_parallel_size": 2}}}),
        "value.megatron_cfg.tensor_model_parallel_size",
        "share one megatron parallel state per trainer rank",
    ),
    (
        "a vlm generates on the megatron engine",
        variant(),
        variant({"policy": {"is_vlm": True, "generation": {"backend": "vllm"}}}),
        "policy.generation.backend",
        "has no Hugging Face form it could load",
    ),
    ("a vlm trains with grpo", ppo(), ppo({"policy": {"is_vlm": True}}), "policy.is_vlm", "GRPO only"),
    (
        "a vlm on one pipeline stage",
        variant(),
        variant({"policy": {"is_vlm": True, "megatron_cfg": {"pipeline_model_parallel_size": 2}}}),
        "policy.megatron_cfg.pipeline_model_parallel_size",
        "run on one pipeline stage",
    ),
    (
        "a vlm without sequence parallelism",
        variant(),
        variant(
            {"policy": {"is_vlm": True, "megatron_cfg": {"tensor_model_parallel_size": 2, "sequence_parallel": True}}}
        ),
        "policy.megatron_cfg.sequence_parallel",
        "merged into the whole sequence",
    ),
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
]
