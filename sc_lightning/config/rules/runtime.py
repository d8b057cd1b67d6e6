"""Validation rules for the async runtime: data plane, capacity, failures, watchdog, checkpoints, recovery."""

from __future__ import annotations

from sc_lightning.config.dotpath_patterns import rollout_knobs_covered
from sc_lightning.config.report import Report, ties
from sc_lightning.config.resolved import required_buffer_capacity, step_floor
from sc_lightning.config.rules.env import ENV_RULES
from sc_lightning.config.samplers import CustomSamplerConfig, InOrderSamplerConfig, SamplerCapabilities
from sc_lightning.config.schema import SCConfig


@ties("data_plane.enabled")
def data_plane_enabled(config: SCConfig, report: Report) -> None:
    """All rollout data moves through the data plane."""
    if not config.data_plane.enabled:
        report.error("data_plane.enabled", "is false; the Single-Controller path requires the data plane, set true")


@ties(
    "async_rl.max_buffered_rollouts",
    "{algo}.num_prompts_per_step",
    "async_rl.sampler.max_lookahead_versions",
    "async_rl.sampler.warmup_lookahead_versions",
    "async_rl.sampler.max_staleness_versions",
    "async_rl.min_groups_for_streaming_train",
)
def buffer_capacity(config: SCConfig, report: Report) -> None:
    """max_buffered_rollouts must hold the sampler's window, or the rollout pump deadlocks."""
    chosen = config.async_rl.max_buffered_rollouts
    if chosen is None or not config.has_one_algorithm:
        return
    required = required_buffer_capacity(config)
    if required is not None and chosen < required:
        sampler = config.async_rl.sampler
        report.error(
            "async_rl.max_buffered_rollouts",
            f"({chosen}) is below the {sampler.name} sampler's required capacity ({required} = "
            f"{_capacity_formula(config)}); the rollout pump would deadlock, set it to at least {required}",
        )


def _capacity_formula(config: SCConfig) -> str:
    sampler, name = config.async_rl.sampler, config.algo_name
    window = sampler.gate_window()
    if window is None:
        return "async_rl.min_groups_for_streaming_train"
    knob = "warmup_lookahead_versions" if window != getattr(sampler, sampler.gate_knob) else sampler.gate_knob
    return f"{name}.num_prompts_per_step x (async_rl.sampler.{knob} + 1)"


@ties("async_rl.sampler.target")
def custom_sampler_importable(config: SCConfig, report: Report) -> None:
    """A custom sampler's target must import and declare its capabilities as plain booleans."""
    if isinstance(config.async_rl.sampler, CustomSamplerConfig):
        _capabilities(config, report)


def _capabilities(config: SCConfig, report: Report) -> SamplerCapabilities | None:
    try:
        return config.async_rl.sampler.capabilities()
    except ValueError as exc:
        report.error("async_rl.sampler.target", str(exc))
        return None


@ties(
    "async_rl.rollout_failure.max_backoff_s",
    "async_rl.rollout_failure.backoff_base_s",
    "async_rl.rollout_failure.on_dropped_prompt",
    "async_rl.rollout_failure.max_replacement_attempts",
    "async_rl.rollout_failure.replacement_reserve_prompts",
    "async_rl.rollout_failure.max_skipped_prompts",
    "async_rl.rollout_failure.max_consecutive_dropped_prompts",
    "async_rl.rollout_failure.min_step_batch_fraction",
    "async_rl.sampler.name",
)
def failure_budgets(config: SCConfig, report: Report) -> None:
    """Back-off, replacement and drop-budget rules of async_rl.rollout_failure."""
    failure, sampler = config.async_rl.rollout_failure, config.async_rl.sampler
    prefix = "async_rl.rollout_failure"
    if failure.max_backoff_s < failure.backoff_base_s:
        report.error(
            f"{prefix}.max_backoff_s",
            f"({failure.max_backoff_s}) is below backoff_base_s ({failure.backoff_base_s}); raise it",
        )
    if failure.on_dropped_prompt == "replace":
        for knob in ("max_replacement_attempts", "replacement_reserve_prompts"):
            if getattr(failure, knob) < 1:
                report.error(f"{prefix}.{knob}", "is 0 with on_dropped_prompt: replace (0 means shrink); set >= 1")
    budget = failure.max_skipped_prompts + failure.max_consecutive_dropped_prompts
    if budget > 0 and sampler.never_stamps_target_steps():
        report.error(
            f"{prefix}.max_skipped_prompts, {prefix}.max_consecutive_dropped_prompts",
            f"allow drops but the {sampler.name} sampler stamps no target step, so a dropped group cannot shrink "
            "its step; set both to 0 or use in_order",
        )
    _drop_warnings(config, report, budget)


def _drop_warnings(config: SCConfig, report: Report, budget: int) -> None:
    failure, sampler = config.async_rl.rollout_failure, config.async_rl.sampler
    prefix = "async_rl.rollout_failure"
    if not config.has_one_algorithm:
        return
    n = config.algo.num_prompts_per_step
    floor = step_floor(n, failure.min_step_batch_fraction)
    shrinking = budget > 0 and failure.on_dropped_prompt == "shrink"
    if isinstance(sampler, InOrderSamplerConfig) and shrinking and floor >= n:
        report.warn(
            f"{prefix}.min_step_batch_fraction",
            f"ceil({n} x {failure.min_step_batch_fraction}) = {floor} leaves no room to shrink; the first drop "
            "fails the run (lower the fraction or use on_dropped_prompt: replace)",
        )
    if failure.on_dropped_prompt == "replace" and sampler.never_stamps_target_steps():
        report.warn(f"{prefix}.on_dropped_prompt", f"replace does nothing with the {sampler.name} sampler")
    if failure.on_dropped_prompt == "replace" and failure.replacement_reserve_prompts > n:
        report.warn(
            f"{prefix}.replacement_reserve_prompts",
            f"({failure.replacement_reserve_prompts}) exceeds a step's {n} prompts; several batches are diverted "
            "before the first admit",
        )


@ties(
    "async_rl.stall_watchdog.stall_timeout_s",
    "async_rl.stall_watchdog.interval_s",
    "async_rl.rollout_failure.generation_timeout_s",
    "async_rl.rollout_failure.env_timeout_s",
    "async_rl.rollout_failure.rollout_timeout_s",
    "async_rl.in_flight_weight_updates",
    "async_rl.drain_timeout_s",
)
def watchdog_deadlines(config: SCConfig, report: Report) -> None:
    """The stall timeout must outlast the check interval and every request deadline (the drain's too, when on)."""
    watchdog, failure = config.async_rl.stall_watchdog, config.async_rl.rollout_failure
    path = "async_rl.stall_watchdog.stall_timeout_s"
    if watchdog.stall_timeout_s <= watchdog.interval_s:
        report.error(path, f"({watchdog.stall_timeout_s}) must exceed interval_s ({watchdog.interval_s})")
    deadlines = {f"async_rl.rollout_failure.{name}": getattr(failure, name) for name in _REQUEST_DEADLINES}
    if not config.async_rl.in_flight_weight_updates:
        deadlines["async_rl.drain_timeout_s"] = config.async_rl.drain_timeout_s
    for knob, value in deadlines.items():
        if value is not None and watchdog.stall_timeout_s <= value:
            report.error(
                path,
                f"({watchdog.stall_timeout_s}) must exceed {knob} ({value}), or a slow but healthy request is "
                "reported as a stall",
            )


_REQUEST_DEADLINES = ("generation_timeout_s", "env_timeout_s", "rollout_timeout_s")


@ties(
    "async_rl.in_flight_weight_updates",
    "async_rl.drain_timeout_s",
    "async_rl.rollout_failure.generation_timeout_s",
)
def drain_deadline(config: SCConfig, report: Report) -> None:
    """The drain gate must outwait one generation request, or a healthy one in flight at a refit fails the run."""
    runtime, generation_timeout = config.async_rl, config.async_rl.rollout_failure.generation_timeout_s
    if runtime.in_flight_weight_updates or generation_timeout is None:
        return
    if runtime.drain_timeout_s < generation_timeout:
        report.error(
            "async_rl.drain_timeout_s",
            f"({runtime.drain_timeout_s}) is below async_rl.rollout_failure.generation_timeout_s ({generation_timeout})"
            "; a healthy generation in flight at a refit would hit the drain deadline, raise it to at least "
            f"{generation_timeout}",
        )


@ties("checkpointing.enabled", "checkpointing.save_data_plane", "async_rl.sampler.target")
def data_plane_checkpoints(config: SCConfig, report: Report) -> None:
    """save_data_plane: required with checkpoint-capable samplers, only with checkpointing.

    Both data-plane backends snapshot natively (TransferQueue ``simple`` and the in-process ``memory`` one).
    """
    ckpt = config.checkpointing
    if ckpt.save_data_plane and not ckpt.enabled:
        report.error("checkpointing.save_data_plane", "is true but checkpointing.enabled is false; enable both")
    if not ckpt.enabled:
        return
    if isinstance(config.async_rl.sampler, CustomSamplerConfig):
        capabilities = _capabilities(config, report)
        if capabilities is None:
            return
        if not capabilities.buffer_checkpoint:
            shadow = " (save_data_plane keeps their rows in shadow mode, unused)" if ckpt.save_data_plane else ""
            report.warn(
                "async_rl.sampler.target",
                "does not declare supports_buffer_checkpoint = True; buffered groups' rows are not restored on "
                f"resume{shadow}: they are generated again from their prompts",
            )
            return
    if ckpt.save_data_plane:
        return
    report.error(
        "checkpointing.save_data_plane",
        "is false with checkpointing enabled; completed, unconsumed rollout groups would be lost on restart, "
        "set it to true",
    )


@ties("checkpointing.export_hf_at_end", "checkpointing.enabled")
def export_at_end(config: SCConfig, report: Report) -> None:
    """The end-of-fit export is made from the fit's final bundle: it needs checkpointing."""
    if config.checkpointing.export_hf_at_end and not config.checkpointing.enabled:
        report.error(
            "checkpointing.export_hf_at_end",
            "is true but checkpointing.enabled is false; the export is written from the fit's final bundle, "
            "enable checkpointing too (or export a bundle later with python -m sc_lightning export)",
        )


@ties("checkpointing.metric_name", "checkpointing.keep_top_k", "checkpointing.save_period", "{algo}.val_period")
def checkpoint_ranking(config: SCConfig, report: Report) -> None:
    """metric_name is a train metric, or a validation metric of a run that validates at every save_period step (so
    each periodic bundle is ranked by its own policy's validation); keep_top_k needs it."""
    ckpt = config.checkpointing
    name = ckpt.metric_name
    if name is not None and not name.startswith(("train:", "val:")):
        report.error(
            "checkpointing.metric_name",
            f"is {name!r}; use 'train:<metric>' (a logged train/<metric>, e.g. 'train:reward') or 'val:<metric>' "
            "(a validation's val/<metric>, e.g. 'val:accuracy')",
        )
    if name is not None and name.startswith("val:"):
        _validation_ranking(config, name, report)
    if ckpt.keep_top_k is not None and name is None:
        report.error("checkpointing.keep_top_k", "ranks bundles by checkpointing.metric_name; set it too")


def _validation_ranking(config: SCConfig, name: str, report: Report) -> None:
    """A ``val:`` ranking needs a validation at every save_period step."""
    period, save_period, algo = config.algo.val_period, config.checkpointing.save_period, config.algo_name
    if period == 0 or save_period % period:
        report.error(
            "checkpointing.metric_name",
            f"is {name!r} but {algo}.val_period is {period} and checkpointing.save_period {save_period}: a bundle "
            "is ranked by the validation of its own step, so validation must run at every save_period step; set "
            f"{algo}.val_period to a divisor of checkpointing.save_period",
        )


@ties(
    "rollout_checkpointing.snapshot_attempt_interval_s",
    "rollout_checkpointing.extra_fingerprint_excluded_paths",
    "checkpointing.enabled",
    "checkpointing.save_data_plane",
    "token_capture.enabled",
    "async_rl.sampler.target",
)
def periodic_snapshots(config: SCConfig, report: Report) -> None:
    """Periodic rollout snapshots need data-plane checkpoints, token capture and a claim-capable sampler.

    Both data-plane backends save and load natively (TransferQueue ``simple`` and the in-process ``memory``), so,
    unlike the reference, ``memory`` qualifies too.
    """
    snap = config.rollout_checkpointing
    for i, path in enumerate(snap.extra_fingerprint_excluded_paths):
        problem = _excluded_path_problem(path)
        if problem:
            report.error(f"rollout_checkpointing.extra_fingerprint_excluded_paths[{i}]", f"{path!r} {problem}")
    if snap.snapshot_attempt_interval_s is None:
        return
    needs = {
        "checkpointing.enabled": config.checkpointing.enabled,
        "checkpointing.save_data_plane": config.checkpointing.save_data_plane,
        "token_capture.enabled": config.token_capture.enabled,
    }
    for knob, ok in needs.items():
        if not ok:
            report.error(
                knob, "must be true for periodic rollout snapshots (rollout_checkpointing.snapshot_attempt_interval_s)"
            )
    capabilities = _capabilities(config, report)
    if capabilities is not None and not (capabilities.buffer_checkpoint and capabilities.training_claims):
        report.error(
            "async_rl.sampler.target",
            "must declare supports_buffer_checkpoint = True and supports_training_claims = True for periodic snapshots",
        )


def _excluded_path_problem(path: str) -> str | None:
    if not path or path != path.strip():
        return "must be a non-empty dotpath without surrounding spaces"
    if path in ("*", "**"):
        return "would exclude the whole config; name a specific dotpath"
    if any(segment == "" for segment in path.split(".")):
        return "has an empty segment"
    if covered := rollout_knobs_covered(path):
        return (
            f"would leave out {', '.join(covered)}, which decide the prompts, the answers or their rewards that a "
            "rollout snapshot holds; exclude only runtime-only dotpaths (logging, placement, deadlines)"
        )
    return None


@ties(
    "rollout_recovery.default_granularity",
    "rollout_recovery.task_source_granularity_overrides",
    "rollout_recovery.agent_granularity_overrides",
    "token_capture.enabled",
)
def recovery_granularity(config: SCConfig, report: Report) -> None:
    """A non-default redispatch granularity needs token capture."""
    if config.rollout_recovery.overrides_default() and not config.token_capture.enabled:
        report.error(
            "rollout_recovery",
            "sets a non-default granularity (prompt_group or overrides) but token_capture.enabled is false; "
            "enable token capture or keep default_granularity: sibling without overrides",
        )


RUNTIME_RULES = (
    data_plane_enabled,
    buffer_capacity,
    custom_sampler_importable,
    failure_budgets,
    watchdog_deadlines,
    drain_deadline,
    data_plane_checkpoints,
    export_at_end,
    checkpoint_ranking,
    periodic_snapshots,
    recovery_granularity,
    *ENV_RULES,
)
