"""Validation rules for the policy (and critic) models, the generation engine, the losses and PPO's settings."""

from __future__ import annotations

from sc_lightning.config.algorithm import truncated_importance_sampling_issues
from sc_lightning.config.report import Report, ties
from sc_lightning.config.resolved import min_groups_for_streaming_train
from sc_lightning.config.samplers import InOrderSamplerConfig, ReadyFirstSamplerConfig
from sc_lightning.config.schema import SCConfig


@ties(
    "policy.generation.backend",
    "policy.generation.colocated.enabled",
    "policy.generation.vllm_cfg.async_engine",
    "policy.generation.top_p",
    "policy.generation.top_k",
    "async_rl.min_groups_for_streaming_train",
    "policy.megatron_cfg.tensor_model_parallel_size",
    "policy.megatron_cfg.pipeline_model_parallel_size",
)
def generation_engine(config: SCConfig, report: Report) -> None:
    """Backend/colocation/async-engine/truncation rules of the generation engine."""
    gen = config.policy.generation
    if gen.colocated.enabled and gen.backend != "megatron":
        report.error(
            "policy.generation.colocated.enabled",
            f"is true with backend {gen.backend!r}; only the megatron backend can be colocated, set it to false",
        )
    megatron_cfg = config.policy.megatron_cfg
    split = (megatron_cfg.tensor_model_parallel_size, megatron_cfg.pipeline_model_parallel_size)
    if gen.colocated.enabled and gen.backend == "megatron" and split != (1, 1):
        report.error(
            "policy.megatron_cfg.tensor_model_parallel_size",
            f"with pipeline_model_parallel_size gives (TP, PP) = {split}, but the colocated Megatron engine runs in "
            "the trainer's process on its parallel state, which it needs at (1, 1): set "
            "policy.generation.colocated.enabled to false (the engine then runs in its own Ray actor) or both to 1",
        )
    if gen.colocated.enabled and gen.backend == "megatron" and config.has_one_algorithm:
        n, threshold = config.algo.num_prompts_per_step, min_groups_for_streaming_train(config)
        if threshold != n:
            report.error(
                "async_rl.min_groups_for_streaming_train",
                f"is {threshold}; colocated generation stands down for the whole train step, so it must equal "
                f"{config.algo_name}.num_prompts_per_step ({n})",
            )
    if gen.backend == "vllm" and not gen.vllm_cfg.async_engine:
        report.error(
            "policy.generation.vllm_cfg.async_engine",
            "is false; rollouts are driven per prompt group, which needs the async engine: set it to true",
        )
    truncation = {"policy.generation.top_p": gen.top_p < 1, "policy.generation.top_k": gen.top_k is not None}
    for path in (p for p, on in truncation.items() if on and gen.backend == "vllm"):
        report.error(
            path,
            "truncates sampling, and vLLM then reports logprobs of the truncated distribution, which the trainer's "
            "full softmax cannot match (importance ratios would be wrong): use top_p 1 and top_k null with vllm, "
            "or the megatron backend",
        )


@ties(
    "data.max_prompt_length",
    "policy.max_total_sequence_length",
    "policy.generation.backend",
    "policy.generation.vllm_cfg.max_model_len",
)
def prompts_fit_the_context(config: SCConfig, report: Report) -> None:
    """data.max_prompt_length must leave room in the engine's context (a completion is cut at its end)."""
    gen, limit = config.policy.generation, config.data.max_prompt_length
    context, knob = config.policy.max_total_sequence_length, "policy.max_total_sequence_length"
    if gen.backend == "vllm" and gen.vllm_cfg.max_model_len is not None:
        context, knob = gen.vllm_cfg.max_model_len, "policy.generation.vllm_cfg.max_model_len"
    if limit >= context:
        report.error(
            "data.max_prompt_length",
            f"({limit}) leaves no room for a completion in the {context}-token context ({knob}); the engine would "
            f"refuse such prompts mid-run, so set it below {context} (or raise {knob})",
        )


@ties(
    "policy.megatron_cfg.enabled",
    "value.megatron_cfg.enabled",
    "policy.megatron_cfg.sequence_parallel",
    "policy.megatron_cfg.pipeline_model_parallel_size",
    "value.megatron_cfg.sequence_parallel",
    "value.megatron_cfg.pipeline_model_parallel_size",
    "policy.megatron_cfg.tensor_model_parallel_size",
    "value.megatron_cfg.tensor_model_parallel_size",
)
def megatron_models(config: SCConfig, report: Report) -> None:
    """megatron-core is the only trainer (and Megatron generation needs it); the critic splits like the policy
    (megatron's parallel state is one per process); sequence parallelism needs TP > 1."""
    if not config.policy.megatron_cfg.enabled:
        report.error("policy.megatron_cfg.enabled", "is false; megatron-core is the only trainer, set it to true")
    if config.value is not None and not config.value.megatron_cfg.enabled:
        report.error("value.megatron_cfg.enabled", "is false; the PPO critic must be a Megatron model, set true")
    for model in ("policy", "value"):
        section = getattr(config, model)
        if section is None:
            continue
        mcfg = section.megatron_cfg
        if mcfg.sequence_parallel and mcfg.tensor_model_parallel_size == 1:
            report.error(
                f"{model}.megatron_cfg.sequence_parallel",
                "is true but tensor_model_parallel_size is 1; sequence parallelism splits the sequence over the "
                "tensor-parallel ranks: raise the TP size or set it to false",
            )
    if config.value is not None:
        for size in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
            policy, critic = getattr(config.policy.megatron_cfg, size), getattr(config.value.megatron_cfg, size)
            if critic != policy:
                report.error(
                    f"value.megatron_cfg.{size}",
                    f"is {critic} but policy.megatron_cfg.{size} is {policy}; the critic and the policy share one "
                    f"megatron parallel state per trainer rank, so set both to the same size",
                )


@ties(
    "policy.is_vlm",
    "policy.generation.backend",
    "policy.megatron_cfg.sequence_parallel",
    "policy.megatron_cfg.pipeline_model_parallel_size",
)
def vision_language_policy(config: SCConfig, report: Report) -> None:
    """A vision-language policy (docs/vlm.md) generates on the Megatron engine, trains with GRPO (no critic), on one
    pipeline stage and without sequence parallelism."""
    if not config.policy.is_vlm:
        return
    if config.policy.generation.backend == "vllm":
        report.error(
            "policy.generation.backend",
            "is vllm with policy.is_vlm: true; vLLM builds Hugging Face architectures, and the VLM policy's vision "
            "side (megatron-core's CLIP ViT and projector) has no Hugging Face form it could load (docs/vlm.md): "
            "use the megatron backend",
        )
    if config.value is not None:
        report.error(
            "policy.is_vlm",
            "is true with a PPO critic (value:); the critic is a text model that would not see the images, so "
            "vision-language training is GRPO only: use grpo:",
        )
    mcfg = config.policy.megatron_cfg
    if mcfg.sequence_parallel:
        report.error(
            "policy.megatron_cfg.sequence_parallel",
            "is true with policy.is_vlm: true; the image embeddings are merged into the whole sequence, which "
            "sequence parallelism splits over ranks first: set it to false",
        )
    if mcfg.pipeline_model_parallel_size > 1:
        report.error(
            "policy.megatron_cfg.pipeline_model_parallel_size",
            f"is {mcfg.pipeline_model_parallel_size} with policy.is_vlm: true; the vision tower and the language "
            "model run on one pipeline stage: set it to 1 (tensor parallelism works)",
        )


@ties(
    "policy.optimizer.lr",
    "policy.optimizer.min_lr",
    "policy.optimizer.lr_decay_style",
    "value.optimizer.lr",
    "value.optimizer.min_lr",
    "value.optimizer.lr_decay_style",
)
def learning_rate_schedule(config: SCConfig, report: Report) -> None:
    """A decaying schedule ends at min_lr, which must not exceed the peak lr."""
    for model in ("policy", "value"):
        section = getattr(config, model)
        if section is None or section.optimizer.lr_decay_style == "constant":
            continue
        opt = section.optimizer
        if opt.min_lr > opt.lr:
            report.error(
                f"{model}.optimizer.min_lr",
                f"({opt.min_lr}) is above {model}.optimizer.lr ({opt.lr}), so the rate would rise; lower it",
            )


@ties(
    "loss_fn.use_importance_sampling_correction",
    "loss_fn.force_on_policy_ratio",
    "async_rl.sampler.name",
    "async_rl.sampler.max_lookahead_versions",
    "async_rl.sampler.warmup_lookahead_versions",
    "async_rl.sampler.max_staleness_versions",
)
def importance_sampling(config: SCConfig, report: Report) -> None:
    """Off-policy samplers need IS correction; ready_first also needs real prev_logprobs."""
    sampler, loss = config.async_rl.sampler, config.loss_fn
    if sampler.is_off_policy() and not loss.use_importance_sampling_correction:
        knob = f"async_rl.sampler.{sampler.gate_knob}" if sampler.gate_knob else "async_rl.sampler.name"
        report.error(
            "loss_fn.use_importance_sampling_correction",
            f"is false but the {sampler.name} sampler ({knob}) admits off-policy data; set it to true",
        )
    if isinstance(sampler, ReadyFirstSamplerConfig) and loss.force_on_policy_ratio:
        report.error(
            "loss_fn.force_on_policy_ratio",
            "is true; ready_first trains on stale groups and needs the real prev_logprobs ratio, set it to false",
        )


@ties(
    "loss_fn.truncated_importance_sampling_type",
    "loss_fn.truncated_importance_sampling_ratio",
    "loss_fn.truncated_importance_sampling_ratio_min",
    "loss_fn.use_importance_sampling_correction",
    "loss_fn.sequence_level_importance_ratios",
)
def truncated_importance_sampling(config: SCConfig, report: Report) -> None:
    """Truncated-IS variants need IS correction, their bounds, and no sequence-level ratios for seq-mask-tis."""
    loss = config.loss_fn
    for knob, problem in truncated_importance_sampling_issues(
        loss.truncated_importance_sampling_type,
        loss.truncated_importance_sampling_ratio,
        loss.truncated_importance_sampling_ratio_min,
        use_importance_sampling_correction=loss.use_importance_sampling_correction,
        sequence_level_importance_ratios=loss.sequence_level_importance_ratios,
    ):
        report.error(f"loss_fn.{knob}", problem)


@ties(
    "loss_fn.reference_policy_kl_penalty",
    "{algo}.skip_reference_policy_logprobs_calculation",
    "loss_fn.sequence_level_importance_ratios",
    "loss_fn.token_level_loss",
)
def loss_consistency(config: SCConfig, report: Report) -> None:
    """KL needs reference logprobs; sequence-level ratios need a sequence-level loss."""
    loss = config.loss_fn
    skips_reference = config.has_one_algorithm and config.algo.skip_reference_policy_logprobs_calculation
    if loss.reference_policy_kl_penalty != 0 and skips_reference:
        report.error(
            "loss_fn.reference_policy_kl_penalty",
            f"is {loss.reference_policy_kl_penalty} but "
            f"{config.algo_name}.skip_reference_policy_logprobs_calculation is true; set the penalty to 0 "
            "or compute reference logprobs",
        )
    if loss.sequence_level_importance_ratios and loss.token_level_loss:
        report.error(
            "loss_fn.sequence_level_importance_ratios",
            "is true (GSPO) with token_level_loss: true; set loss_fn.token_level_loss: false",
        )


@ties(
    "async_rl.sampler.name",
    "async_rl.rollout_failure.max_skipped_prompts",
    "async_rl.rollout_failure.max_consecutive_dropped_prompts",
    "async_rl.min_groups_for_streaming_train",
    "policy.offload_optimizer_for_logprob",
    "async_rl.sampler.warmup_lookahead_versions",
    "ppo.policy_training_start_step",
    "ppo.max_num_steps",
)
def ppo_rules(config: SCConfig, report: Report) -> None:
    """PPO: in_order only, no drop budgets, whole-step chunks, offloaded optimizer, warm-up knobs coherent (and a
    warning when the critic warm-up outlasts the run)."""
    sampler = config.async_rl.sampler
    warmup = sampler.warmup_lookahead_versions if isinstance(sampler, InOrderSamplerConfig) else None
    if config.ppo is None or config.grpo is not None:  # GRPO, or both blocks (which the algorithm rules name)
        if config.ppo is None and warmup is not None:
            report.error(
                "async_rl.sampler.warmup_lookahead_versions",
                "is a PPO critic-warm-up knob; delete it from this GRPO config",
            )
        return
    if not isinstance(sampler, InOrderSamplerConfig):
        report.error("async_rl.sampler.name", f"is {sampler.name!r}; PPO runs support only in_order for now")
    failure = config.async_rl.rollout_failure
    for budget in ("max_skipped_prompts", "max_consecutive_dropped_prompts"):
        if getattr(failure, budget) != 0:
            report.error(
                f"async_rl.rollout_failure.{budget}",
                f"is {getattr(failure, budget)}; a drop would shorten the critic's batch, PPO needs 0",
            )
    n, threshold = config.ppo.num_prompts_per_step, min_groups_for_streaming_train(config)
    if threshold != n:
        report.error(
            "async_rl.min_groups_for_streaming_train",
            f"is {threshold}; a PPO step is one chunk, set it to ppo.num_prompts_per_step ({n})",
        )
    if not config.policy.offload_optimizer_for_logprob:
        report.error(
            "policy.offload_optimizer_for_logprob",
            "is false; PPO keeps the policy optimizer off the accelerator while the critic runs, set it to true",
        )
    start, steps = config.ppo.policy_training_start_step, config.ppo.max_num_steps
    if start >= steps:  # legal: a first command may warm the critic up, and a resume with more steps go on
        report.warn(
            "ppo.policy_training_start_step",
            f"is {start} but ppo.max_num_steps is {steps}: every step of this run is critic warm-up and the policy "
            "does not train; set it below ppo.max_num_steps, unless a resumed run with more steps will train it",
        )
    if warmup is not None:
        _ppo_warmup_window_rules(config, warmup, report)


def _ppo_warmup_window_rules(config: SCConfig, warmup: int, report: Report) -> None:
    """``warmup_lookahead_versions`` needs a warm-up to apply to, and at least the steady-state lookahead."""
    assert config.ppo is not None
    if config.ppo.policy_training_start_step == 0:
        report.error(
            "async_rl.sampler.warmup_lookahead_versions",
            "is set but ppo.policy_training_start_step is 0 (no warm-up); set the start step or drop the knob",
        )
    lookahead = config.async_rl.sampler.max_lookahead_versions
    if warmup < lookahead:
        report.error(
            "async_rl.sampler.warmup_lookahead_versions",
            f"({warmup}) is below max_lookahead_versions ({lookahead}); raise it",
        )


MODEL_RULES = (
    generation_engine,
    prompts_fit_the_context,
    megatron_models,
    vision_language_policy,
    learning_rate_schedule,
    importance_sampling,
    truncated_importance_sampling,
    loss_consistency,
    ppo_rules,
)
