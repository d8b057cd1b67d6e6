"""Drop budgets: when a prompt group whose retries are spent may be dropped, and what that does to its step.

A rollout whose attempt budget is spent (``rollout/failures.py``) either stops the run or is *dropped*:

- after **data** failures, while fewer than ``max_skipped_prompts`` groups were skipped so far in the run;
- after **infra** failures, while no more than ``max_consecutive_dropped_prompts`` groups were dropped in a row
  (any commit resets the run of drops: one broken prompt is tolerated, a dead fleet is not).

A dropped group stamped for step *t* leaves *t* one group short (its *shortfall*): the step closes with
``N - shortfall`` groups, and a step that would fall below ``ceil(N x min_step_batch_fraction)`` stops the run.
With ``on_dropped_prompt: replace`` a spare prompt from the replacement reserve takes the dropped group's place
(see ``reserve.py``) and the step keeps its size. The per-step ledgers feed ``train/dropped_prompt_groups``,
``train/replaced_prompt_groups`` and ``train/promoted_prompt_groups``; budgets and shortfalls go into
checkpoints, so a resumed run neither forgets a spent budget nor waits for a group that was dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sc_lightning.config.resolved import step_floor
from sc_lightning.controller.api import StepDrops
from sc_lightning.rollout.failures import FailureKind


class DropBudgetExhausted(RuntimeError):
    """A failed prompt group could not be dropped: its drop budget is spent; the original failure is the cause."""


class StepBelowFloor(RuntimeError):
    """Dropped groups left a step with fewer groups than ``min_step_batch_fraction`` allows."""


@dataclass(frozen=True)
class DropBudgets:
    """The ``async_rl.rollout_failure`` knobs that decide drops (the defaults allow none)."""

    groups_per_step: int
    max_skipped_prompts: int = 0
    max_consecutive_dropped_prompts: int = 0
    min_step_batch_fraction: float = 0.9
    replacing: bool = False  # on_dropped_prompt: replace (a shrink then means no spare was left for the slot)

    @property
    def step_floor(self) -> int:
        """The fewest groups a shrunk step may keep: ``ceil(N x min_step_batch_fraction)``, at least 1."""
        return step_floor(self.groups_per_step, self.min_step_batch_fraction)


@dataclass
class DropLedger:
    """Run-wide drop budgets and the per-step shortfall, replacement and promotion counts."""

    budgets: DropBudgets
    skipped: int = 0  # groups dropped after data failures, run total
    consecutive_infra: int = 0  # groups dropped after infra failures since the last commit
    totals: Counter[str] = field(default_factory=Counter)  # dropped / replaced / promoted, run totals
    shortfall: Counter[int] = field(default_factory=Counter)  # step -> groups dropped without a replacement
    _dropped: Counter[int] = field(default_factory=Counter)
    _replaced: Counter[int] = field(default_factory=Counter)
    _promoted: Counter[int] = field(default_factory=Counter)

    def allow_drop(self, failure: BaseException, kind: FailureKind) -> None:
        """Charge a failed group to its budget; DropBudgetExhausted (caused by ``failure``) when none is left."""
        b = self.budgets
        if (b.max_skipped_prompts if kind == "data" else b.max_consecutive_dropped_prompts) == 0:
            raise failure  # no drops allowed of this kind: the failure itself stops the run
        if kind == "data":
            if self.skipped >= b.max_skipped_prompts:
                raise DropBudgetExhausted(
                    f"{failure}; no prompt group may be dropped after data failures beyond "
                    f"async_rl.rollout_failure.max_skipped_prompts={b.max_skipped_prompts} ({self.skipped} so far)"
                ) from failure
            self.skipped += 1
        else:
            if self.consecutive_infra >= b.max_consecutive_dropped_prompts:
                raise DropBudgetExhausted(
                    f"{failure}; {self.consecutive_infra + 1} prompt group(s) in a row failed on infrastructure, "
                    f"more than async_rl.rollout_failure.max_consecutive_dropped_prompts="
                    f"{b.max_consecutive_dropped_prompts}"
                ) from failure
            self.consecutive_infra += 1
        self.totals["dropped"] += 1

    def on_commit(self) -> None:
        """A group committed: the run of consecutive infra drops ends."""
        self.consecutive_infra = 0

    def shrink(self, target_step: int | None, current_step: int, prompt_id: str) -> None:
        """The dropped group is not replaced: its step closes one group short (StepBelowFloor past the floor).

        ``target_step`` None (a sampler that stamps no step) charges the step being assembled, for the metric only.
        """
        step = current_step if target_step is None else target_step
        self._dropped[step] += 1
        if target_step is None or target_step < current_step:
            return  # nothing waits for it: no shortfall to credit
        b = self.budgets
        if self.target_groups(target_step) - 1 < b.step_floor:  # checked first: a target never goes below the floor
            remedy = (
                "raise async_rl.rollout_failure.replacement_reserve_prompts or max_replacement_attempts (no spare "
                "was left for the slot)"
                if b.replacing
                else "use async_rl.rollout_failure.on_dropped_prompt: replace"
            )
            raise StepBelowFloor(
                f"step {target_step} lost {self.shortfall[target_step] + 1} of {b.groups_per_step} prompt groups to "
                f"dropped rollouts (last: prompt {prompt_id}), below the floor of {b.step_floor} = ceil("
                f"{b.groups_per_step} x async_rl.rollout_failure.min_step_batch_fraction="
                f"{b.min_step_batch_fraction}); lower the fraction, raise the retry budgets, or {remedy}"
            )
        self.shortfall[target_step] += 1

    def replaced(self, step: int) -> None:
        """A spare prompt's group committed in place of a dropped one, for ``step``."""
        self._replaced[step] += 1
        self.totals["replaced"] += 1

    def promoted(self, step: int) -> None:
        """A ready group of a later step was re-stamped into ``step`` to stand in for a dropped one."""
        self._promoted[step] += 1
        self.totals["promoted"] += 1

    def target_groups(self, step: int) -> int:
        """How many groups ``step`` closes with: N less its shortfall."""
        return self.budgets.groups_per_step - self.shortfall[step]

    def close_step(self, step: int) -> StepDrops:
        """Step ``step`` trained: its counts, and forget every ledger entry up to it."""
        closed = StepDrops(self._dropped[step], self._replaced[step], self._promoted[step])
        for ledger in (self.shortfall, self._dropped, self._replaced, self._promoted):
            for key in [k for k in ledger if k <= step]:
                del ledger[key]
        return closed

    def state_dict(self) -> dict[str, Any]:
        """The budgets spent and the open steps' shortfalls (JSON-able; keys as strings)."""
        return {
            "skipped": self.skipped,
            "consecutive_infra": self.consecutive_infra,
            "totals": dict(self.totals),
            "shortfall": {str(step): n for step, n in self.shortfall.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint from before drop budgets existed restores nothing)."""
        self.skipped = int(state.get("skipped", 0))
        self.consecutive_infra = int(state.get("consecutive_infra", 0))
        self.totals = Counter({k: int(v) for k, v in state.get("totals", {}).items()})
        self.shortfall = Counter({int(step): int(n) for step, n in state.get("shortfall", {}).items()})
