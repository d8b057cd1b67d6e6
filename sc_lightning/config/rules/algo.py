"""Validation rules for the algorithm blocks (epochs, validation, dynamic sampling, estimators) and the step's batch;
the model, engine, loss and PPO rules are in :mod:`~sc_lightning.config.rules.model`."""

from __future__ import annotations

from sc_lightning.config.algorithm import GAEAdvantage, GRPOAdvantage
from sc_lightning.config.report import Report, ties
from sc_lightning.config.resolved import min_groups_for_streaming_train, response_limit
from sc_lightning.config.rules.model import MODEL_RULES
from sc_lightning.config.schema import SCConfig


@ties("grpo", "ppo")
def one_algorithm_block(config: SCConfig, report: Report) -> None:
    """Exactly one of grpo / ppo."""
    if config.grpo is not None and config.ppo is not None:
        report.error("grpo, ppo", "only one algorithm block may be present; delete the one you are not running")
    elif config.grpo is None and config.ppo is None:
        report.error("grpo", "a run needs a grpo: block (or a ppo: block for PPO)")


@ties("grpo.async_grpo", "ppo.async_ppo")
def no_legacy_async_block(config: SCConfig, report: Report) -> None:
    """A legacy grpo.async_grpo / ppo.async_ppo block is rejected with its async_rl translation."""
    if not config.has_one_algorithm:
        return
    name = config.algo_name
    legacy = config.grpo.async_grpo if config.grpo is not None else config.ppo.async_ppo
    if legacy is None:
        return
    key = f"{name}.async_{name}"
    age = legacy.get("max_trajectory_age_steps")
    translation = f"async_rl.sampler: {{name: in_order, max_lookahead_versions: {age}}}"
    hint = (
        f"; its max_trajectory_age_steps: {age} becomes {translation}"
        if age is not None
        else "; sync semantics are async_rl.sampler.max_lookahead_versions: 0"
    )
    report.error(key, f"the Single-Controller path reads async knobs from async_rl; set {key}: null{hint}")


@ties("{algo}.max_num_epochs", "{algo}.max_num_steps")
def positive_epochs(config: SCConfig, report: Report) -> None:
    """max_num_epochs must be positive (there is no -1 convention)."""
    if config.has_one_algorithm and config.algo.max_num_epochs <= 0:
        path = f"{config.algo_name}.max_num_epochs"
        report.error(
            path,
            f"is {config.algo.max_num_epochs}, which trains zero steps (there is no -1 convention); "
            f"set a positive number of epochs and bound the run with {config.algo_name}.max_num_steps",
        )


@ties("{algo}.val_period", "{algo}.val_at_start", "{algo}.val_at_end", "data.val_dataset_name", "data.dataset_name")
def validation_has_data(config: SCConfig, report: Report) -> None:
    """Validation needs a validation set: the builtin one exists only for the arithmetic task."""
    if not config.has_one_algorithm or not config.algo.validates():
        return
    if config.data.val_dataset_name is None and config.data.dataset_name != "arithmetic":
        report.error(
            "data.val_dataset_name",
            f"is null but validation is on ({config.algo_name}.val_period / val_at_start / val_at_end) and "
            f"data.dataset_name={config.data.dataset_name!r} has no builtin validation set; set the path of a "
            "dataset file",
        )


@ties(
    "{algo}.reward_shaping.enabled",
    "{algo}.reward_shaping.overlong_buffer_length",
    "{algo}.reward_shaping.overlong_buffer_penalty",
    "{algo}.reward_shaping.max_response_length",
    "policy.generation.max_new_tokens",
    "env.name",
)
def overlong_shaping_fits(config: SCConfig, report: Report) -> None:
    """Overlong shaping needs its buffer and penalty; the buffer fits inside the length it is measured against."""
    if not config.has_one_algorithm or not config.algo.reward_shaping.enabled:
        return
    shaping, block = config.algo.reward_shaping, f"{config.algo_name}.reward_shaping"
    for knob in ("overlong_buffer_length", "overlong_buffer_penalty"):
        if getattr(shaping, knob) is None:
            report.error(f"{block}.{knob}", "is null but reward_shaping.enabled is true; set it (DAPO: 4096 and 1.0)")
    if shaping.overlong_buffer_penalty is not None and shaping.overlong_buffer_penalty < 0:
        report.error(
            f"{block}.overlong_buffer_penalty",
            f"is {shaping.overlong_buffer_penalty}; it is the reward taken away at the length limit, so give a "
            "number >= 0",
        )
    if config.env.is_multiturn() and shaping.max_response_length is None:
        report.error(
            f"{block}.max_response_length",
            "is null in a multi-turn run, where no per-completion limit applies (env.max_conversation_tokens counts "
            "the prompt); set the response length the penalty is measured against",
        )
    limit = response_limit(config)
    if shaping.overlong_buffer_length is not None and shaping.overlong_buffer_length > limit:
        report.error(
            f"{block}.overlong_buffer_length",
            f"({shaping.overlong_buffer_length}) exceeds the length the penalty is measured against ({limit}: "
            f"{block}.max_response_length, else the longest completion); set it to at most {limit}",
        )


@ties("{algo}.reward_scaling.enabled", "{algo}.reward_scaling.source_min", "{algo}.reward_scaling.source_max")
def reward_scaling_range(config: SCConfig, report: Report) -> None:
    """Reward scaling maps a non-empty source range."""
    if not config.has_one_algorithm or not config.algo.reward_scaling.enabled:
        return
    scaling, block = config.algo.reward_scaling, f"{config.algo_name}.reward_scaling"
    if scaling.source_max <= scaling.source_min:
        report.error(
            f"{block}.source_max",
            f"({scaling.source_max}) must exceed {block}.source_min ({scaling.source_min}): the raw rewards' range",
        )


@ties("{algo}.use_dynamic_sampling", "{algo}.num_generations_per_prompt", "{algo}.batch_multiplier")
def dynamic_sampling_fits(config: SCConfig, report: Report) -> None:
    """Dynamic sampling is GRPO's and needs groups that can vary; batch_multiplier (over-generation) stays 1."""
    if not config.has_one_algorithm:
        return
    algo, name = config.algo, config.algo_name
    if algo.batch_multiplier != 1:
        report.error(
            f"{name}.batch_multiplier",
            f"is {algo.batch_multiplier}; over-generation is not supported (each filtered group is refilled as it "
            "is filtered, while async_rl.sampler.max_lookahead_versions keeps generation ahead); set 1",
        )
    if not algo.use_dynamic_sampling:
        return
    if config.ppo is not None:
        report.error(
            f"{name}.use_dynamic_sampling",
            "is true on PPO; dynamic sampling filters GRPO groups with equal rewards, which PPO's GAE advantages "
            "do not need; set false",
        )
    if algo.num_generations_per_prompt < 2:
        report.error(
            f"{name}.use_dynamic_sampling",
            f"is true with {name}.num_generations_per_prompt={algo.num_generations_per_prompt}: a group of one "
            "has zero reward variance, so every group would be filtered; set num_generations_per_prompt >= 2",
        )


@ties("{algo}.adv_estimator.name")
def estimator_matches_algorithm(config: SCConfig, report: Report) -> None:
    """GRPO uses the group baseline (or opd, distillation); PPO uses GAE over critic values."""
    if not config.has_one_algorithm:
        return
    estimator = config.algo.adv_estimator
    if config.grpo is not None and isinstance(estimator, GAEAdvantage):
        report.error("grpo.adv_estimator.name", "is 'gae', which needs a critic; use a ppo: block or name: grpo")
    if config.ppo is not None and isinstance(estimator, GRPOAdvantage):  # opd too: it subclasses the GRPO estimator
        report.error("ppo.adv_estimator.name", f"is {estimator.name!r}; a PPO run needs the gae estimator (name: gae)")


@ties("value", "value_loss_fn")
def critic_sections_match_algorithm(config: SCConfig, report: Report) -> None:
    """value / value_loss_fn are required on PPO and forbidden on GRPO."""
    if not config.has_one_algorithm:
        return
    for key in ("value", "value_loss_fn"):
        present = getattr(config, key) is not None
        if config.grpo is not None and present:
            report.error(key, "belongs to PPO runs; delete it from this GRPO config (or switch grpo: to ppo:)")
        if config.ppo is not None and not present:
            report.error(key, "is required on a PPO run; add a value: and a value_loss_fn: block")


@ties(
    "{algo}.num_prompts_per_step",
    "{algo}.num_generations_per_prompt",
    "policy.train_global_batch_size",
    "value.train_global_batch_size",
)
def batch_matches_step(config: SCConfig, report: Report) -> None:
    """One RL step is exactly one training batch: N prompts x G generations."""
    if not config.has_one_algorithm:
        return
    name, algo = config.algo_name, config.algo
    per_step = algo.num_prompts_per_step * algo.num_generations_per_prompt
    models = [("policy", config.policy.train_global_batch_size)]
    if config.value is not None and config.ppo is not None:
        models.append(("value", config.value.train_global_batch_size))
    for model, size in models:
        if size != per_step:
            report.error(
                f"{model}.train_global_batch_size",
                f"is {size} but {name}.num_prompts_per_step x {name}.num_generations_per_prompt = "
                f"{algo.num_prompts_per_step} x {algo.num_generations_per_prompt} = {per_step}; one RL step must be "
                f"one batch, so set {model}.train_global_batch_size: {per_step}",
            )


@ties("async_rl.min_groups_for_streaming_train", "{algo}.num_prompts_per_step")
def streaming_threshold_within_step(config: SCConfig, report: Report) -> None:
    """min_groups_for_streaming_train <= num_prompts_per_step."""
    if not config.has_one_algorithm:
        return
    n, threshold = config.algo.num_prompts_per_step, min_groups_for_streaming_train(config)
    if threshold > n:
        report.error(
            "async_rl.min_groups_for_streaming_train",
            f"is {threshold} but a step has only {config.algo_name}.num_prompts_per_step = {n} groups; set <= {n}",
        )


ALGORITHM_RULES = (
    one_algorithm_block,
    no_legacy_async_block,
    positive_epochs,
    validation_has_data,
    overlong_shaping_fits,
    reward_scaling_range,
    dynamic_sampling_fits,
    estimator_matches_algorithm,
    critic_sections_match_algorithm,
    batch_matches_step,
    streaming_threshold_within_step,
    *MODEL_RULES,
)
