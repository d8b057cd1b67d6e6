"""Runtime sections: ``async_rl``, ``data_plane``, checkpointing, rollout snapshots, token capture, recovery."""

from __future__ import annotations

from typing import Literal

from sc_lightning.config.knobs import knob, section
from sc_lightning.config.samplers import InOrderSamplerConfig, SamplerConfig

Granularity = Literal["sibling", "prompt_group"]

_RENAMED_FAILURE_KEYS = {
    "max_attempts_per_prompt": "max_infra_attempts_per_prompt",
    "on_data_exhausted": "max_skipped_prompts",
}
_MOVED_TO_FAILURE = ("generation_timeout_s", "env_timeout_s", "rollout_timeout_s")
_RENAMED_ASYNC_BLOCKS = {"watchdog": "stall_watchdog"}


@section
class RolloutFailureConfig:
    """Retry and drop budgets for failed rollouts, and the per-request deadlines."""

    max_infra_attempts_per_prompt: int = knob(5, "Attempts per prompt group on infrastructure failures.", ge=1)
    max_data_attempts_per_prompt: int = knob(2, "Attempts per prompt group on data failures.", ge=1)
    backoff_base_s: float = knob(1.0, "First retry back-off after an infrastructure failure.", unit="s", gt=0)
    max_backoff_s: float = knob(30.0, "Cap of the exponential back-off; >= backoff_base_s.", unit="s", gt=0)
    max_skipped_prompts: int = knob(0, "Prompt groups that may be dropped after data failures (run total).", ge=0)
    max_consecutive_dropped_prompts: int = knob(0, "Consecutive groups that may be dropped after infra failures.", ge=0)
    min_step_batch_fraction: float = knob(
        0.9, "A step shrunk by drops must keep at least this share of groups.", gt=0, le=1
    )
    on_dropped_prompt: Literal["shrink", "replace"] = knob("shrink", "Shrink the step or replace the dropped group.")
    max_replacement_attempts: int = knob(1, "Spare prompts tried per dropped slot (replace mode; >= 1).", ge=0)
    replacement_reserve_prompts: int = knob(0, "Spare prompts held for replacements (replace mode; >= 1).", ge=0)
    generation_timeout_s: float | None = knob(600.0, "Deadline of one generation request.", unit="s", gt=0)
    env_timeout_s: float | None = knob(120.0, "Deadline of one environment (reward) step.", unit="s", gt=0)
    rollout_timeout_s: float | None = knob(
        None, "Deadline of a whole prompt group, retries included (null = none).", unit="s", gt=0
    )

    @classmethod
    def unknown_key_hint(cls, key: str) -> str | None:
        """Renamed knobs name their replacement."""
        new = _RENAMED_FAILURE_KEYS.get(key)
        return f"has been renamed; use async_rl.rollout_failure.{new}" if new else None


@section
class StallWatchdogConfig:
    """Detects a run that makes no progress (no commit and no train step) for too long."""

    interval_s: float = knob(30.0, "How often progress is checked and rollout metrics are published.", unit="s", gt=0)
    stall_timeout_s: float = knob(
        1200.0,
        "No progress for this long is a stall; must exceed interval_s and every request deadline.",
        unit="s",
        gt=0,
    )
    stall_action: Literal["warn", "abort"] = knob("abort", "What a stall does: log a warning or end the run.")


@section
class AsyncRLConfig:
    """Knobs of the asynchronous Single-Controller runtime."""

    sampler: SamplerConfig = knob(
        doc="Staleness sampler; pick the mode with sampler.name.", factory=InOrderSamplerConfig
    )
    max_buffered_rollouts: int | None = knob(
        None,
        "Hard cap on unconsumed groups in the buffer (null = the sampler's required capacity; "
        "windowed: 2 x num_prompts_per_step x (max_staleness_versions + 1)).",
        unit="groups",
        ge=1,
    )
    min_groups_for_streaming_train: int | None = knob(
        None,
        "Ready groups the trainer waits for before training a chunk (null = num_prompts_per_step).",
        unit="groups",
        ge=1,
    )
    max_inflight_prompts: int | None = knob(
        None, "Prompt groups generating at once (null = max_buffered_rollouts).", unit="groups", ge=1
    )
    recompute_kv_cache_after_weight_updates: bool = knob(
        False, "Invalidate the engines' KV cache after each refit so in-flight requests re-prefill on new weights."
    )
    rollout_failure: RolloutFailureConfig = knob(doc="Retry/drop budgets and deadlines.", factory=RolloutFailureConfig)
    stall_watchdog: StallWatchdogConfig = knob(doc="Stall detection.", factory=StallWatchdogConfig)

    @classmethod
    def unknown_key_hint(cls, key: str) -> str | None:
        """Keys that moved or were renamed name their new home."""
        if key in _MOVED_TO_FAILURE:
            return f"has moved; set async_rl.rollout_failure.{key}"
        if key in _RENAMED_ASYNC_BLOCKS:
            return f"has been renamed; use async_rl.{_RENAMED_ASYNC_BLOCKS[key]}"
        return None


@section
class DataPlaneConfig:
    """The data plane that carries rollout tensors between the rollout and train pumps."""

    enabled: bool = knob(True, "Must be true: the Single-Controller path moves all rollout data through it.")
    backend: Literal["simple", "memory"] = knob(
        "simple", "simple = TransferQueue SimpleStorage on Ray; memory = in-process (single process only)."
    )
    storage_capacity: int = knob(100_000, "Rows the storage units hold in total.", unit="rows", ge=1)
    num_storage_units: int = knob(1, "TransferQueue storage-unit actors (each needs one Ray CPU).", ge=1)
    partition_id: str = knob("rollout_data", "Data-plane partition that holds the rollout rows.")


@section
class CheckpointingConfig:
    """Trainer checkpoints (model, optimizer, dataloader, controller, data plane)."""

    enabled: bool = knob(False, "Write checkpoints and resume from the latest one.")
    checkpoint_dir: str = knob("results/checkpoints", "Where bundles go; durable and shared across nodes.")
    save_period: int = knob(10, "Save every N RL steps (and at the end).", unit="steps", ge=1)
    save_data_plane: bool = knob(False, "Snapshot the data plane so completed, unconsumed groups survive a restart.")
    save_optimizer: bool = knob(True, "Include optimizer state.")
    keep_top_k: int | None = knob(
        None, "Keep the best K bundles by metric_name, and always the newest (null = keep all).", ge=1
    )
    metric_name: str | None = knob(None, 'Metric ranking bundles, "train:<metric>" (there is no validation loop).')
    higher_is_better: bool = knob(True, "Whether a larger metric_name is better.")


@section
class RolloutCheckpointingConfig:
    """Periodic rollout snapshots between trainer checkpoints."""

    snapshot_attempt_interval_s: float | None = knob(
        None, "Try a rollout snapshot this often (null = off).", unit="s", gt=0
    )
    keep_latest_k: int = knob(2, "Committed snapshots kept per anchor.", ge=1)
    restore_mode: Literal["latest", "trainer_checkpoint"] = knob(
        "latest", "Resume from the newest compatible snapshot, or from the trainer bundle only."
    )
    extra_fingerprint_excluded_paths: tuple[str, ...] = knob(
        doc="Extra runtime-only dotpaths left out of the bootstrap fingerprint (* one level, ** any).", factory=tuple
    )
    max_consecutive_failures: int = knob(3, "Snapshot failures in a row before the run stops.", ge=1)


@section
class TokenCaptureConfig:
    """Staging of finished generations so recovery can keep sealed siblings."""

    enabled: bool = knob(
        False, "Seal each finished generation before its group commits, so recovery keeps it (sibling granularity)."
    )


@section
class RolloutRecoveryConfig:
    """How unfinished prompt groups are redispatched after a failure or restart."""

    default_granularity: Granularity = knob(
        "sibling", "sibling: redispatch only unfinished generations; prompt_group: regenerate the whole group."
    )
    task_source_granularity_overrides: dict[str, Granularity] = knob(
        doc="Granularity by the row's task_source (needs token_capture.enabled).", factory=dict
    )
    agent_granularity_overrides: dict[str, Granularity] = knob(
        doc="Granularity by the row's agent_ref name; wins over task_source (needs token_capture.enabled).",
        factory=dict,
    )

    def overrides_default(self) -> bool:
        """Whether any policy other than the default sibling granularity is configured."""
        values = [self.default_granularity, *self.task_source_granularity_overrides.values()]
        return any(v != "sibling" for v in values + list(self.agent_granularity_overrides.values()))


@section
class DataConfig:
    """The prompt dataset."""

    dataset_name: str = knob("arithmetic", "Built-in task name or a path to a JSONL file of prompts.")
    shuffle: bool = knob(True, "Shuffle prompts each epoch (seeded by the algorithm block's seed).")
    max_prompt_length: int = knob(
        256,
        "Prompts longer than this are rejected when loading (a JSONL row is skipped within data.max_skipped_rows).",
        unit="tokens",
        ge=1,
    )
    max_skipped_rows: int = knob(
        0,
        "Malformed or over-long dataset rows that may be skipped (each logged with file:line and reason); one more "
        "is an error.",
        unit="rows",
        ge=0,
    )
    train_data_log: bool = knob(
        False,
        "Write <trainer.default_root_dir>/train_data.jsonl, one JSON object per trained row (step, prompt_index, "
        "prompt_id, generation_index, start_weight, end_weight, reward); a resume rolls it back to its checkpoint.",
    )


@section
class EnvConfig:
    """The environment that scores completions."""

    name: str = knob(
        "arithmetic",
        'Built-in verifier (arithmetic, math), or a custom Environment class "package.module:ClassName".',
    )
