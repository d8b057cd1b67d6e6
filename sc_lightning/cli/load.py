"""A whole config loaded and checked without starting anything: the spec sections, then Lightning's ``trainer:``.

One YAML holds the spec's sections at top level (``grpo:``, ``policy:``, ``async_rl:`` …) and Lightning's
``trainer:`` / ``seed_everything:``. Several ``--config`` files are deep-merged in order, then ``--a.b.c value``
overrides apply, then ``${…}`` interpolations resolve. The spec sections are loaded and validated first (cheap,
no Lightning import), then LightningCLI parses the Lightning side (:mod:`sc_lightning.cli.parser`); any problem
is one ConfigError listing every error, which ends the command with exit code 2 before any model, engine, Ray or
data plane starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from sc_lightning.cli.lean_imports import import_lightning
from sc_lightning.config import (
    ConfigError,
    ConfigIssue,
    SCConfig,
    config_to_dict,
    load_config,
    validate_single_controller_config,
)
from sc_lightning.config.yaml_io import load_yaml_layers

LIGHTNING_KEYS = ("trainer", "seed_everything")


def load_and_check(configs: Sequence[str], overrides: Sequence[str] = ()) -> tuple[SCConfig, dict[str, Any]]:
    """Load, validate and type-check a whole config (spec sections and ``trainer:``) without starting anything.

    Returns the typed spec config and the resolved Lightning keys; raises one ConfigError listing every problem.
    Spec-section problems are found first and without importing Lightning, so a bad config fails in moments.
    """
    raw = load_yaml_layers(configs, overrides)
    try:
        config = load_config(raw, extra_top_level=LIGHTNING_KEYS)
    except ConfigError as spec_error:
        raise ConfigError(spec_error.issues + _trainer_issues(raw)) from None
    issues, lightning = [], {}
    try:
        validate_single_controller_config(config)
    except ConfigError as error:
        issues.extend(error.issues)
    if config.has_one_algorithm:  # the Lightning side's seed defaults to the algorithm's
        try:
            lightning = parse_lightning_side(raw, config)
        except ConfigError as error:
            issues.extend(error.issues)
    else:  # the rules above said which block is missing or extra; the trainer's keys are still checked
        issues.extend(_trainer_issues(raw))
    if issues:
        raise ConfigError(issues)
    return config, lightning


def _trainer_issues(raw: dict[str, Any]) -> list[Any]:
    import_lightning()
    from sc_lightning.cli.parser import trainer_key_issues

    return trainer_key_issues(raw.get("trainer") or {})


def parse_lightning_side(raw: dict[str, Any], config: SCConfig) -> dict[str, Any]:
    """Check ``trainer:`` / ``seed_everything:`` through LightningCLI's own parser; returns them resolved."""
    import_lightning()
    from sc_lightning.cli.parser import parse_trainer_arguments

    lightning = {key: raw[key] for key in LIGHTNING_KEYS if key in raw}
    lightning.setdefault("seed_everything", config.algo.seed)
    seed = lightning["seed_everything"]
    if not isinstance(seed, int):  # bool is an int too: Lightning's true picks a seed, false none
        found = f"{type(seed).__name__} {seed!r}"
        raise ConfigError([ConfigIssue("seed_everything", f"expected an int (or true / false), got {found}")])
    return parse_trainer_arguments(lightning, config)


def render_config(config: SCConfig, lightning: dict[str, Any]) -> str:
    """The whole resolved config as YAML: Lightning's keys first, then every spec section."""
    data = {**lightning, **config_to_dict(config)}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
