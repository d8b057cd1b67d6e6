"""Assemble a SingleController from a validated config and its parts (data plane, engine, environment, data).

With :mod:`sc_lightning.controller.api`, this is the only module outside code imports from the controller: the
composition surface. A composition root (the Lightning strategy) builds the controller here, hosts it in a
:class:`LocalController` (a background event-loop thread) and, on a resume, restores it with
:func:`resume_restorer` before its pump starts.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sc_lightning.config import SCConfig, resolve
from sc_lightning.controller.buffer import TQReplayBuffer
from sc_lightning.controller.controller import SingleController
from sc_lightning.controller.drops import DropBudgets
from sc_lightning.controller.dynamic_sampling import DynamicSampling
from sc_lightning.controller.parts import ControllerParts, ControllerSettings
from sc_lightning.controller.recovery import RecoveryPolicy
from sc_lightning.controller.reserve import ReplacementReserve
from sc_lightning.controller.runners import BeforeStart, LocalController
from sc_lightning.controller.samplers import SamplerError, create_sampler
from sc_lightning.controller.validation import ValidationSettings, Validator
from sc_lightning.controller.watchdog import StallWatchdog
from sc_lightning.data_plane.base import DataPlane
from sc_lightning.engines.base import GenerationEngine
from sc_lightning.rollout.answers import AnswerSettings
from sc_lightning.rollout.dataset_base import PromptDataset
from sc_lightning.rollout.datasets import build_validation_set
from sc_lightning.rollout.envs.base import Environment, answer_check
from sc_lightning.rollout.images import ImageFormat
from sc_lightning.rollout.manager import RolloutManager, RolloutSettings, ServedPolicy
from sc_lightning.rollout.multiturn.protocol import MultiTurnEnvironment, TurnLimits
from sc_lightning.rollout.multiturn.source import attach_multiturn
from sc_lightning.rollout.prompts import PromptStream
from sc_lightning.rollout.reward_shaping import reward_transform
from sc_lightning.rollout.teachers import TeacherScoring, check_routes
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import SamplingParams

__all__ = [
    "BeforeStart",
    "LocalController",
    "answer_settings",
    "build_controller",
    "build_validator",
    "controller_settings",
    "resume_restorer",
    "rollout_settings",
]
log = logging.getLogger(__name__)


def rollout_settings(config: SCConfig) -> RolloutSettings:
    """Sampling and deadlines of each prompt group, from the policy's generation block and async_rl."""
    generation, failure = config.policy.generation, config.async_rl.rollout_failure
    return RolloutSettings(
        generations_per_prompt=config.algo.num_generations_per_prompt,
        sampling=SamplingParams(
            max_new_tokens=generation.max_new_tokens,
            temperature=generation.temperature,
            top_p=generation.top_p,
            top_k=generation.top_k,
        ),
        generation_timeout_s=failure.generation_timeout_s,
        env_timeout_s=failure.env_timeout_s,
        seed=config.algo.seed,
        refit_timeout_s=generation.refit_timeout_s,
        rollout_timeout_s=failure.rollout_timeout_s,
        max_infra_attempts=failure.max_infra_attempts_per_prompt,
        max_data_attempts=failure.max_data_attempts_per_prompt,
        backoff_base_s=failure.backoff_base_s,
        max_backoff_s=failure.max_backoff_s,
    )


def build_controller(
    config: SCConfig,
    *,
    data_plane: DataPlane,
    engine: GenerationEngine,
    environment: Environment | MultiTurnEnvironment,
    tokenizer: Tokenizer,
    dataset: PromptDataset,
    weight_version: int = 0,
    images: ImageFormat | None = None,
    teachers: TeacherScoring | None = None,
) -> SingleController:
    """A ready-to-start controller for ``config``; the sampler's capacity need is checked on the instance.
    ``images``: a vision-language policy's image format (its validation prompts' images take it). ``teachers``: a
    distillation run's, which score each group before its commit and each validation completion."""
    resolved = resolve(config)
    buffer = TQReplayBuffer(data_plane)
    sampler = create_sampler(buffer, config.async_rl.sampler)
    required = sampler.required_buffer_capacity(resolved.groups_per_step)
    if required is not None and resolved.max_buffered_rollouts < required:
        raise SamplerError(
            f"async_rl.max_buffered_rollouts ({resolved.max_buffered_rollouts}) is below the sampler's required "
            f"capacity ({required}); the rollout pump would deadlock"
        )
    served = ServedPolicy(engine, weight_version)
    manager = RolloutManager(served, environment, tokenizer, buffer, rollout_settings(config))
    manager.reward_transform = reward_transform(config)
    manager.teacher_scoring = teachers
    if isinstance(environment, MultiTurnEnvironment) and not isinstance(environment, Environment):
        attach_multiturn(manager, environment, TurnLimits.from_env_config(config.env))
    prompts = PromptStream(
        dataset,
        resolved.groups_per_step,
        shuffle=config.data.shuffle,
        seed=config.algo.seed,
        max_epochs=config.algo.max_num_epochs,
    )
    parts = ControllerParts(
        buffer=buffer,
        sampler=sampler,
        manager=manager,
        prompts=prompts,
        reserve=_replacement_reserve(config),
        dynamic_sampling=DynamicSampling(resolved.groups_per_step, config.algo.dynamic_sampling_max_gen_batches)
        if config.algo.use_dynamic_sampling
        else None,
        validator=build_validator(config, manager.environment, tokenizer, images=images, teachers=teachers),
    )
    controller = SingleController(parts, controller_settings(config))
    watchdog = config.async_rl.stall_watchdog
    controller.add_background_task(
        "stall watchdog", StallWatchdog(watchdog.interval_s, watchdog.stall_timeout_s, watchdog.stall_action).run
    )
    return controller


def controller_settings(config: SCConfig) -> ControllerSettings:
    """The controller's capacities, drop budgets, recovery policy, drain deadline and warm-up window."""
    resolved, failure = resolve(config), config.async_rl.rollout_failure
    return ControllerSettings(
        max_buffered_rollouts=resolved.max_buffered_rollouts,
        max_inflight_prompts=resolved.max_inflight_prompts,
        recovery=RecoveryPolicy(config.rollout_recovery, token_capture=config.token_capture.enabled),
        drop_budgets=DropBudgets(
            groups_per_step=resolved.groups_per_step,
            max_skipped_prompts=failure.max_skipped_prompts,
            max_consecutive_dropped_prompts=failure.max_consecutive_dropped_prompts,
            min_step_batch_fraction=failure.min_step_batch_fraction,
            replacing=failure.on_dropped_prompt == "replace",
        ),
        drain_timeout_s=None if config.async_rl.in_flight_weight_updates else config.async_rl.drain_timeout_s,
        warmup_window=_warmup_window(config),
    )


def build_validator(
    config: SCConfig,
    environment: Environment,
    tokenizer: Tokenizer,
    *,
    images: ImageFormat | None = None,
    teachers: TeacherScoring | None = None,
) -> Validator | None:
    """The validator of a run that validates (``{algo}.val_period`` / ``val_at_start`` / ``val_at_end``), else None.
    ``images``: the policy's image format (a vision-language policy), None for a text one. ``teachers``: a
    distillation run's, which score the validation completions (every validation prompt's route is checked here).

    It validates the steps ``{algo}.validation_due`` names, sampling as the rollouts do (one completion per prompt).
    """
    algo = config.algo
    if not algo.validates():
        return None
    prompts = build_validation_set(
        config.data,
        tokenizer,
        max_samples=algo.max_val_samples,
        check_answer=answer_check(environment),
        images=images,
    )
    if teachers is not None:
        check_routes(prompts, teachers.config)  # an unknown teacher fails now, naming the validation row
    settings = ValidationSettings(
        due=lambda step: algo.validation_due(step, last_step=algo.max_num_steps),
        timeout_s=algo.val_timeout_s,
        answering=answer_settings(config),
    )
    return Validator(prompts, environment, tokenizer, settings, teachers)


def answer_settings(config: SCConfig) -> AnswerSettings:
    """How a pass outside the training stream (a validation, ``generate``) answers its prompts: sampling as the
    rollouts do, ``{algo}.val_batch_size`` requests at once, seeded by ``{algo}.seed``, each request under
    ``async_rl.rollout_failure.generation_timeout_s``."""
    return AnswerSettings(
        sampling=rollout_settings(config).sampling,
        concurrency=config.algo.val_batch_size,
        seed=config.algo.seed,
        generation_timeout_s=config.async_rl.rollout_failure.generation_timeout_s,
    )


def _replacement_reserve(config: SCConfig) -> ReplacementReserve:
    """The spare-prompt pool of ``on_dropped_prompt: replace`` (empty and never filled with shrink)."""
    failure = config.async_rl.rollout_failure
    if failure.on_dropped_prompt != "replace":
        return ReplacementReserve()
    return ReplacementReserve(failure.replacement_reserve_prompts, failure.max_replacement_attempts)


def _warmup_window(config: SCConfig) -> tuple[int, int] | None:
    """PPO critic warm-up with a wider lookahead: (the step it ends at, the lookahead after it)."""
    sampler = config.async_rl.sampler
    warmup = getattr(sampler, "warmup_lookahead_versions", None)
    if config.ppo is None or warmup is None:
        return None
    return config.ppo.policy_training_start_step, sampler.max_lookahead_versions


def resume_restorer(
    state: dict[str, Any], weights: list[tuple[str, torch.Tensor]], *, group_size: int, source: object
) -> BeforeStart:
    """Restore a controller from a checkpoint's controller ``state``, and load ``weights`` into its engine.

    Runs on the controller's loop before its pump starts; ``source`` (the bundle or snapshot) is named in the log.
    """

    async def restore(controller: SingleController) -> None:
        """Load the controller state, then give the engine the restored weights at the trainer's version."""
        await controller.restore(state, group_size=group_size)
        await controller.push_weights(weights, int(state["trainer_version"]))
        log.info("resumed from %s at RL step %d", source, state["trainer_version"])

    return restore
