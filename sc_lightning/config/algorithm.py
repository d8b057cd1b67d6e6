"""Algorithm sections: the ``grpo:`` / ``ppo:`` step blocks and the ``loss_fn:`` / ``value_loss_fn:`` losses."""

from __future__ import annotations

from typing import Any, Literal

from sc_lightning.config.knobs import knob, section


@section
class GRPOAdvantage:
    """GRPO group-relative advantage estimator."""

    name: Literal["grpo"] = knob("grpo", "Advantage estimator; GRPO runs use the group baseline.")
    normalize_rewards: bool = knob(True, "Divide each advantage by its group's reward std (where std > 0).")
    use_leave_one_out_baseline: bool = knob(True, "Baseline of a sample = mean reward of the other samples.")


@section
class OPDAdvantage(GRPOAdvantage):
    """On-policy distillation: each model token's advantage is its teacher's logprob minus the sampler's
    (``on_policy_distillation:`` names the teachers), plus reward_weight x the GRPO advantage."""

    name: Literal["opd"] = knob("opd", "Advantage estimator; on-policy distillation from the routed teacher.")
    reward_weight: float = knob(
        0.0, "Weight of the GRPO reward advantage added to each token's distillation advantage (0: none).", ge=0
    )


@section
class GAEAdvantage:
    """Generalised advantage estimation over critic values (PPO)."""

    name: Literal["gae"] = knob("gae", "Advantage estimator; PPO runs need GAE.")
    gae_lambda: float = knob(0.95, "GAE lambda.", ge=0, le=1)
    gae_gamma: float = knob(1.0, "Discount per token.", ge=0, le=1)
    normalize_advantages: bool = knob(True, "Whiten advantages over the valid tokens of the step.")


@section
class RewardShaping:
    """DAPO's overlong reward shaping: a penalty ramping linearly over the last tokens before the length limit."""

    enabled: bool = knob(False, "Apply the overlong penalty to every training reward (after reward_scaling).")
    overlong_buffer_length: int | None = knob(
        None, "Tokens before the length limit over which the penalty ramps from 0 to the full penalty.", ge=0
    )
    overlong_buffer_penalty: float | None = knob(None, "Reward taken away at the length limit.")
    max_response_length: int | None = knob(
        None,
        "Response length the penalty is measured against (null = policy.generation.max_new_tokens; multi-turn "
        "runs set it).",
        unit="tokens",
        ge=1,
    )


@section
class RewardScaling:
    """Linear reward rescaling: clamp to the source range, map onto the target range."""

    enabled: bool = knob(False, "Clamp every training reward to the source range and map it onto the target range.")
    source_min: float = knob(0.0, "Lower end of the raw reward range.")
    source_max: float = knob(1.0, "Upper end of the raw reward range.")
    target_min: float = knob(0.0, "Lower end of the scaled range.")
    target_max: float = knob(1.0, "Upper end of the scaled range.")


@section
class AlgorithmConfig:
    """Step settings shared by the ``grpo:`` and ``ppo:`` blocks (exactly one of which is present)."""

    num_prompts_per_step: int = knob(
        32, "Prompt groups per RL step (= per optimizer step on GRPO).", unit="groups", ge=1
    )
    num_generations_per_prompt: int = knob(16, "Completions generated per prompt (the group size).", ge=1)
    max_num_epochs: int = knob(1, "Passes over the prompt dataset; must be positive.", unit="epochs")
    max_num_steps: int = knob(1000, "RL steps to train; the run ends after this step.", unit="steps", ge=1)
    seed: int = knob(42, "Seed for the prompt order and generation sampling.")
    val_period: int = knob(
        0, "Validate every N steps at weight version N, beside the rollouts (0 = never).", unit="steps", ge=0
    )
    val_at_start: bool = knob(False, "Validate weight version 0 before the first step.")
    val_at_end: bool = knob(False, "Validate the final weight version after the last step.")
    max_val_samples: int | None = knob(
        None, "Validation prompts per validation: the first N of the validation set (null = all).", ge=1
    )
    val_batch_size: int = knob(
        8,
        "Validation prompts generated at once: the bound on validation's share of the engine (one completion each).",
        unit="prompts",
        ge=1,
    )
    val_timeout_s: float = knob(
        600.0,
        "Deadline of one validation; the refit after its step waits for it at most this long.",
        unit="s",
        gt=0,
    )
    reward_shaping: RewardShaping = knob(doc="Reward shaping block.", factory=RewardShaping)
    reward_scaling: RewardScaling = knob(doc="Reward scaling block.", factory=RewardScaling)
    use_dynamic_sampling: bool = knob(
        False,
        "DAPO dynamic sampling (GRPO only): a group whose rewards are all equal is filtered before its commit "
        "(consumed, never trained) and a fresh dataset prompt takes its slot.",
    )
    dynamic_sampling_max_gen_batches: int = knob(
        10,
        "With dynamic sampling: generation batches (of num_prompts_per_step groups, the first included) one step "
        "may take; a step that would need more refills stops the run.",
        unit="batches",
        ge=1,
    )
    batch_multiplier: float = knob(
        1.0,
        "NeMo-RL's over-generation factor for dynamic sampling; only 1 (refills replace filtered groups one by "
        "one while generation runs ahead of training).",
        ge=1,
    )
    overlong_filtering: bool = knob(False, "Exclude truncated completions from the loss through sample_mask.")
    seq_logprob_error_threshold: float | None = knob(
        None,
        "Drop from the loss each sequence whose mean exp|log pi_gen - log pi_old| over its tokens (>= 1; 1 = the "
        "engine and trainer agree) exceeds this; null = log the error only.",
        gt=0,
    )
    skip_reference_policy_logprobs_calculation: bool = knob(
        False, "Skip the reference-model logprob pass; requires loss_fn.reference_policy_kl_penalty: 0."
    )
    adv_estimator: GRPOAdvantage | OPDAdvantage | GAEAdvantage = knob(doc="Advantage estimator.", factory=GRPOAdvantage)

    def validates(self) -> bool:
        """Whether the run validates at all (every val_period steps, at the start or at the end)."""
        return self.val_period > 0 or self.val_at_start or self.val_at_end

    def validation_due(self, step: int, *, last_step: int) -> bool:
        """Whether weight version ``step`` is validated: 0 with val_at_start, the last with val_at_end, else
        every val_period-th."""
        if step == 0:
            return self.val_at_start
        if step == last_step and self.val_at_end:
            return True
        return self.val_period > 0 and step % self.val_period == 0


@section
class GRPOConfig(AlgorithmConfig):
    """The GRPO algorithm block (``grpo:``): one RL step is one optimizer step."""

    async_grpo: dict[str, Any] | None = knob(None, "Legacy async block; must be null (configure async_rl instead).")


@section
class PPOConfig(AlgorithmConfig):
    """The PPO algorithm block (``ppo:``): a policy trained with a Megatron critic and GAE."""

    num_generations_per_prompt: int = knob(1, "Completions generated per prompt.", ge=1)
    adv_estimator: GRPOAdvantage | OPDAdvantage | GAEAdvantage = knob(
        doc="Advantage estimator; PPO needs gae.", factory=GAEAdvantage
    )
    ppo_epochs: int = knob(1, "Policy updates per RL step over the step's batch.", ge=1)
    critic_ppo_epochs: int | None = knob(None, "Critic updates per RL step (null = ppo.ppo_epochs).", ge=1)
    policy_training_start_step: int = knob(
        0, "Critic warm-up: before this step the policy is neither trained nor refit.", unit="steps", ge=0
    )
    warm_start_value_checkpoint: str | None = knob(
        None, "Seed the critic from this checkpoint directory (fresh runs only; ignored on resume)."
    )
    async_ppo: dict[str, Any] | None = knob(None, "Legacy async block; must be null (configure async_rl instead).")

    def critic_epochs(self) -> int:
        """Critic updates per RL step, defaulting to ppo_epochs."""
        return self.critic_ppo_epochs if self.critic_ppo_epochs is not None else self.ppo_epochs


@section
class LossConfig:
    """The clipped policy-gradient loss (``loss_fn:``), with importance-sampling correction for async data."""

    reference_policy_kl_penalty: float = knob(0.01, "KL(policy || reference) coefficient beta; 0 disables.", ge=0)
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = knob("k3", "KL estimator.")
    kl_input_clamp_value: float | None = knob(20.0, "Clamp of the log-ratio fed to the KL estimator.", gt=0)
    kl_output_clamp_value: float | None = knob(10.0, "Clamp of the per-token KL value.", gt=0)
    ratio_clip_min: float = knob(0.2, "PPO ratio clip below 1: ratios under 1 - ratio_clip_min are clipped.", ge=0)
    ratio_clip_max: float = knob(0.2, "PPO ratio clip above 1: ratios over 1 + ratio_clip_max are clipped.", ge=0)
    ratio_clip_c: float | None = knob(None, "Dual-clip constant (> 1) for negative advantages; null disables.", gt=1)
    use_on_policy_kl_approximation: bool = knob(False, "Weight the KL by pi/pi_gen instead of 1.")
    use_importance_sampling_correction: bool = knob(
        True, "Weight each token by pi_old/pi_gen; required whenever the sampler admits off-policy data."
    )
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None = knob(
        None, "Truncation of the IS weights (needs use_importance_sampling_correction)."
    )
    truncated_importance_sampling_ratio: float | None = knob(None, "Upper IS-weight bound for truncation.", gt=0)
    truncated_importance_sampling_ratio_min: float | None = knob(
        None, "Lower IS-weight bound (required by icepop and seq-mask-tis).", ge=0
    )
    token_level_loss: bool = knob(True, "Normalise by valid tokens of the step (false: by valid sequences).")
    force_on_policy_ratio: bool = knob(False, "Use ratio = exp(logp - logp.detach()) (always 1, keeps gradient).")
    sequence_level_importance_ratios: bool = knob(False, "GSPO: one importance ratio per sequence.")
    max_token_staleness: int | None = knob(
        None,
        "Tokens sampled by weights more than this many versions behind the trainer leave the policy loss (the step "
        "normalises over the rest); null keeps every token. Per token: a refit mid-request splits a completion.",
        ge=0,
    )


@section
class ValueLossConfig:
    """The clipped value (critic) loss (``value_loss_fn:``), PPO only."""

    value_clip_epsilon: float | None = knob(0.2, "Clip of V around V_old; null disables clipping.", gt=0)
    value_loss_coef: float = knob(1.0, "Scale of 0.5 * max((V - R)^2, (V_clip - R)^2).", gt=0)


def truncated_importance_sampling_issues(
    kind: str | None,
    high: float | None,
    low: float | None,
    *,
    use_importance_sampling_correction: bool,
    sequence_level_importance_ratios: bool,
) -> list[tuple[str, str]]:
    """What is wrong with a truncated-IS setting, as (``loss_fn`` knob, problem) pairs; empty when it is coherent.

    The one statement of these rules: the config validation and :class:`~sc_lightning.algorithms.ClippedPGLoss` both
    report from it.
    """
    prefix = "truncated_importance_sampling"
    if kind is None:
        if high is not None or low is not None:
            return [(f"{prefix}_type", "is null but truncation bounds are set; name the variant or drop the bounds")]
        return []
    issues = []
    if not use_importance_sampling_correction:
        issues.append((f"{prefix}_type", f"is {kind!r} without loss_fn.use_importance_sampling_correction: true"))
    if high is None:
        issues.append((f"{prefix}_ratio", f"is required by truncated_importance_sampling_type {kind!r}"))
    if kind in ("icepop", "seq-mask-tis") and low is None:
        issues.append((f"{prefix}_ratio_min", f"is required by truncated_importance_sampling_type {kind!r}"))
    if high is not None and low is not None and low > high:
        issues.append((f"{prefix}_ratio_min", f"({low}) exceeds truncated_importance_sampling_ratio ({high})"))
    if kind == "seq-mask-tis" and sequence_level_importance_ratios:
        issues.append((f"{prefix}_type", "seq-mask-tis cannot be combined with sequence_level_importance_ratios"))
    return issues
