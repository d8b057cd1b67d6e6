"""Survivorship per step: the groups trained, committed and evicted between two refits, with their mean reward and
mean completion length (:class:`~sc_lightning.controller.api.StepSurvivorship`, logged as ``survivorship/*``).

A sampler that prefers some prompts (fresh ones, short ones, easy ones) can starve others without any counter
moving: the trained groups then differ from the committed ones. Comparing the three cohorts shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from sc_lightning.controller.api import Cohort, GroupMeta, StepSurvivorship

Kind = Literal["trained", "committed", "evicted"]


class SurvivorshipTally:
    """Sums of the current step's cohorts; :meth:`close_step` returns them and starts the next step."""

    def __init__(self) -> None:
        self._sums: dict[Kind, list[float]] = {}
        self._reset()

    def _reset(self) -> None:
        self._sums = {kind: [0, 0.0, 0.0] for kind in ("trained", "committed", "evicted")}

    def add(self, kind: Kind, groups: Sequence[GroupMeta]) -> None:
        """Count ``groups`` into the step's ``kind`` cohort."""
        sums = self._sums[kind]
        for group in groups:
            sums[0] += 1
            sums[1] += group.reward_mean
            sums[2] += group.completion_length_mean

    def close_step(self) -> StepSurvivorship:
        """The closed step's cohorts (each mean over its groups; 0 for an empty cohort); the tally starts over."""
        cohorts = {
            kind: Cohort(int(n), reward / n, length / n) if n else Cohort()
            for kind, (n, reward, length) in self._sums.items()
        }
        self._reset()
        return StepSurvivorship(**cohorts)
