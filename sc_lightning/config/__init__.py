"""Typed configuration of a run and its fail-fast validation.

``load_config(raw)`` turns YAML data into an :class:`SCConfig`; ``validate_single_controller_config(config)``
enforces every cross-field rule. Both raise :class:`ConfigError` listing every problem at once.
"""

from sc_lightning.config.knobs import ConfigError, ConfigIssue
from sc_lightning.config.resolved import Resolved, resolve
from sc_lightning.config.schema import SECTION_NAMES, SCConfig, config_to_dict, load_config
from sc_lightning.config.validate import check_config, validate_single_controller_config

__all__ = [
    "SECTION_NAMES",
    "ConfigError",
    "ConfigIssue",
    "Resolved",
    "SCConfig",
    "check_config",
    "config_to_dict",
    "load_config",
    "resolve",
    "validate_single_controller_config",
]
