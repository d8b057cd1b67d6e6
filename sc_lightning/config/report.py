"""The collector that validation rules record their errors and warnings in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from sc_lightning.config.knobs import ConfigIssue


@dataclass
class Report:
    """Errors and warnings collected by the rules."""

    errors: list[ConfigIssue] = field(default_factory=list)
    warnings: list[ConfigIssue] = field(default_factory=list)

    def error(self, path: str, message: str) -> None:
        """Record a problem that must be fixed before the run may start."""
        issue = ConfigIssue(path, message)
        if issue not in self.errors:  # several rules may trip over the same root cause
            self.errors.append(issue)

    def warn(self, path: str, message: str) -> None:
        """Record a setting that is legal but probably not what the user wants."""
        self.warnings.append(ConfigIssue(path, message))


RuleFn = TypeVar("RuleFn", bound=Callable)


def ties(*dotpaths: str) -> Callable[[RuleFn], RuleFn]:
    """Declare the knobs a rule ties together (``{algo}`` = grpo or ppo), for the generated config reference."""

    def mark(rule: RuleFn) -> RuleFn:
        """Attach the dotpaths to the rule function."""
        rule.ties = dotpaths
        return rule

    return mark
