"""The bootstrap fingerprint: a fail-closed identity of everything in a config that can change rollout semantics.

Rollout state saved before the first trainer checkpoint (the bootstrap anchor) may only be restored into a run whose
config is *compatible*: the same values everywhere except at operational paths — logging, placement, checkpoint
location, ports, deadlines of the machinery, credentials — which :data:`BUILTIN_EXCLUDED_PATHS` lists, plus the
user's ``rollout_checkpointing.extra_fingerprint_excluded_paths``. Anything else, including keys this package does
not know (an external algorithm's config), counts: a change blocks the restore instead of silently mixing
incompatible rollout state.

Patterns are dotpaths whose segments match with ``fnmatch`` (``*`` one mapping key or list index, ``?``, ``[...]``)
and ``**`` matches any number of levels, zero included. An excluded path removes its value and all its children.

- :func:`compatibility_identity` — the config as nested plain data, minus the excluded paths;
- :func:`fingerprint` — SHA-256 over the canonical JSON of ``{schema_version, excluded_paths, identity}``;
- :func:`with_added_knobs` — an older identity completed with the defaults of knobs added since;
- :func:`changed_paths` / :func:`check_compatible` — the exact dotpaths that differ, ``path: old -> new``, for the
  error that rejects a restart (identities never hold credentials: their keys are excluded at any depth).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from sc_lightning.config.dotpath_patterns import path_matches

SCHEMA_VERSION = 1
MAX_REPORTED_CHANGES = 20
MAX_VALUE_CHARS = 160

CREDENTIAL_PATTERNS = (
    "**.api_key",
    "**.*_api_key",
    "**.password",
    "**.*_password",
    "**.secret",
    "**.*_secret",
    "**.token",
    "**.*_token",
    "**.auth_token",
    "**.credentials",
)
"""Keys that hold credentials, at any depth: never part of an identity, so never written to a manifest."""

BUILTIN_EXCLUDED_PATHS = (
    # where and how the run records itself
    "checkpointing",
    "rollout_checkpointing",
    "trainer.logger",
    "trainer.callbacks",
    "trainer.default_root_dir",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.log_every_n_steps",
    "trainer.enable_checkpointing",
    "trainer.max_steps",
    # placement and capacity of the machinery (not what it computes)
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "policy.megatron_cfg.tensor_model_parallel_size",
    "value.megatron_cfg.tensor_model_parallel_size",
    "policy.generation.colocated",
    "policy.generation.vllm_cfg.gpu_memory_utilization",
    "policy.generation.vllm_cfg.kv_cache_memory_bytes",
    "policy.generation.vllm_cfg.max_num_seqs",
    "policy.generation.vllm_cfg.expose_http_server",
    "policy.generation.mcore_generation_config.expose_http_server",
    "policy.generation.refit_timeout_s",
    "async_rl.drain_timeout_s",
    "data_plane.storage_capacity",
    "async_rl.stall_watchdog",
    # what the trainer records of the rows it trained (train_data.jsonl, samples/): never what they are
    "data.train_data_log",
    "data.sample_log_*",
    # a skip budget never changes which rows a file yields: rows are kept or skipped by their content alone
    "data.max_skipped_rows",
    # how long the run trains: a resume may train a run longer or shorter, from a bootstrap snapshot as from a bundle
    "grpo.max_num_steps",
    "ppo.max_num_steps",
    # validation runs beside the rollouts on its own prompts: it never produces or consumes a training rollout
    "grpo.val_*",
    "ppo.val_*",
    "grpo.max_val_samples",
    "ppo.max_val_samples",
    "data.val_dataset_name",
    # the trainer's own optimisation does not change the meaning of rollouts already generated
    "policy.optimizer",
    "policy.scheduler",
    "value.optimizer",
    "value.scheduler",
    *CREDENTIAL_PATTERNS,
)


class FingerprintMismatch(ValueError):
    """A restart's config is not compatible with the saved rollout state; the message lists what changed."""


def _segments(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.split("."))


def compatibility_identity(config: Mapping[str, Any], excluded: Iterable[str] = ()) -> dict[str, Any]:
    """``config`` (plain nested data) without the built-in and ``excluded`` paths and their children."""
    patterns = [_segments(p) for p in (*BUILTIN_EXCLUDED_PATHS, *excluded)]

    def _keep(value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, Mapping):
            items = ((str(k), v) for k, v in value.items())
        elif isinstance(value, list | tuple):
            items = ((str(i), v) for i, v in enumerate(value))
        else:
            return value
        kept = {k: _keep(v, (*path, k)) for k, v in items if not any(path_matches((*path, k), p) for p in patterns)}
        return kept if isinstance(value, Mapping) else [kept[k] for k in sorted(kept, key=int)]

    return _keep(config, ())


def fingerprint(identity: Mapping[str, Any], excluded: Iterable[str] = ()) -> str:
    """Hex SHA-256 of the canonical JSON of the schema version, the sorted exclusions and ``identity``."""
    document = {
        "schema_version": SCHEMA_VERSION,
        "excluded_paths": sorted({*BUILTIN_EXCLUDED_PATHS, *excluded}),
        "identity": identity,
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


_MISSING = object()


def _flatten(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key, child in value.items():
            out.update(_flatten(child, f"{path}.{key}" if path else str(key)))
        return out
    return {path: value}


def _show(value: Any) -> str:
    text = "(absent)" if value is _MISSING else json.dumps(value, default=str)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def with_added_knobs(
    saved: Mapping[str, Any], current: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """``saved`` (an identity an older version wrote) with each path it lacks and ``current`` has taken from
    ``defaults`` (today's default config): a knob added since is at the value that keeps the older behaviour, so a
    run still at that default is compatible, and one that changed it is not."""
    merged = dict(saved)
    for key, value in current.items():
        if key not in defaults:
            continue
        if key not in merged:
            merged[key] = defaults[key]
        elif isinstance(value, Mapping) and isinstance(merged[key], Mapping) and isinstance(defaults[key], Mapping):
            merged[key] = with_added_knobs(merged[key], value, defaults[key])
    return merged


def changed_paths(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``path: old -> new`` for every leaf dotpath whose value differs between two identities, sorted."""
    old, new = _flatten(saved), _flatten(current)
    return [
        f"{path}: {_show(old.get(path, _MISSING))} -> {_show(new.get(path, _MISSING))}"
        for path in sorted(old.keys() | new.keys())
        if old.get(path, _MISSING) != new.get(path, _MISSING)
    ]


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any], *, where: str) -> None:
    """FingerprintMismatch naming the changed dotpaths (at most 20) unless the two identities are equal."""
    changes = changed_paths(saved, current)
    if not changes:
        return
    shown = "\n  ".join(changes[:MAX_REPORTED_CHANGES])
    more = f"\n  ... and {len(changes) - MAX_REPORTED_CHANGES} more" if len(changes) > MAX_REPORTED_CHANGES else ""
    raise FingerprintMismatch(
        f"the config is not compatible with the rollout state saved in {where} ({len(changes)} changed "
        f"dotpaths):\n  {shown}{more}\nRestore with the original values; if a changed value is operational (it "
        "cannot affect prompts, generation, rewards or how saved rollouts are read), list it in "
        "rollout_checkpointing.extra_fingerprint_excluded_paths on both runs; or start fresh with a new "
        "checkpointing.checkpoint_dir. Nothing was deleted."
    )
