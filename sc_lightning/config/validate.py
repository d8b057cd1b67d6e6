"""validate_single_controller_config: every cross-field rule of the spec, all errors reported at once.

Each rule is a small function ``rule(config, report)`` that records errors (which stop the run before anything
starts) and warnings (printed). Every message names the dotpath(s), the value(s) and the fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from sc_lightning.config.knobs import ConfigError, ConfigIssue
from sc_lightning.config.report import Report
from sc_lightning.config.rules import RULES
from sc_lightning.config.schema import SCConfig

Rule = Callable[[SCConfig, Report], None]


def check_config(config: SCConfig) -> Report:
    """Run every rule and return the report without raising."""
    report = Report()
    for rule in RULES:
        rule(config, report)
    return report


def validate_single_controller_config(config: SCConfig) -> list[ConfigIssue]:
    """Enforce every rule; raise ConfigError listing all errors, else emit and return the warnings."""
    report = check_config(config)
    if report.errors:
        raise ConfigError(report.errors)
    for issue in report.warnings:
        warnings.warn(f"sc_lightning config: {issue}", UserWarning, stacklevel=2)
    return report.warnings
