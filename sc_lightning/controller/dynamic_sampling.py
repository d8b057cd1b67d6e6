"""Dynamic sampling (DAPO, ``grpo.use_dynamic_sampling``): groups with no advantage are filtered and refilled.

A prompt group whose N rewards are all equal gets exactly zero advantage from the GRPO estimator (see
``algorithms/advantages.py``), so training on it only costs time. With dynamic sampling on, the rollout manager
checks each scored group *before* its commit (:func:`zero_reward_variance`): a filtered group never enters the
buffer, its generated tokens count as engine waste, and its dispatch slot takes a fresh prompt from the dataset (the
spares left over from an earlier refill first, then the prompt stream's next batch, whose other prompts become
spares). The refill keeps the slot's target step, permits and dispatch-gate entry, so each step still gets
``num_prompts_per_step`` groups with reward variance.

Variance is taken over all N rewards, masked generations (``ScoredGroup.masked``) included, because the
estimator's baseline is: a group whose unmasked rewards agree but whose masked one differs still has non-zero
advantages, and is kept.

The cap (NeMo-RL's ``dynamic_sampling_max_gen_batches``, batches of ``num_prompts_per_step`` groups per step, the
first one included) bounds the extra generations a step may take: ``(max_gen_batches - 1) x num_prompts_per_step``.
A filtered group that would need a refill beyond it stops the run (:class:`DynamicSamplingCapExceeded`), as the
reference does; when the dataset has no prompt left for a refill, the step closes one group short instead.

Exactly once: a filtered prompt is *consumed* — its ledger entry is replaced by the refill's (or forgotten), and
the refill prompt is taken from the stream (or the spares) with no await before the ledger holds it, so a
checkpoint cut never repeats or loses one. The spares are the replacement reserve's pool, saved with the stream's
cursor. Per step, ``dynamic_sampling/filtered_groups`` and ``dynamic_sampling/extra_generations`` are logged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sc_lightning.controller.reserve import ReplacementReserve
from sc_lightning.rollout.manager import GroupFiltered
from sc_lightning.types import Prompt, ScoredGroup

FILTER_REASON = "zero_reward_variance"


class DynamicSamplingCapExceeded(RuntimeError):
    """A step filtered more groups than ``dynamic_sampling_max_gen_batches`` lets it regenerate."""


def zero_reward_variance(group: ScoredGroup) -> str | None:
    """``FILTER_REASON`` when every reward of the group is equal (masked ones included), else None."""
    return FILTER_REASON if max(group.rewards) == min(group.rewards) else None


@dataclass
class DynamicSampling:
    """Per-step filtered and extra-generation counts, and the cap on extra generations."""

    groups_per_step: int
    max_gen_batches: int
    totals: Counter[str] = field(default_factory=Counter)  # filtered / extra_generations, run totals
    _filtered: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # step -> its filtered groups' records
    _extra: Counter[int] = field(default_factory=Counter)

    @property
    def extra_cap(self) -> int:
        """The most extra generations (refills) one step may take."""
        return (self.max_gen_batches - 1) * self.groups_per_step

    def filtered(self, step: int, failure: GroupFiltered, prompt_index: int | None) -> None:
        """Record a group filtered for ``step`` (its prompt is consumed)."""
        record = {
            "prompt_index": prompt_index,
            "prompt_id": failure.prompt_id,
            "group_id": failure.group_id,
            "filtered": failure.reason,
            "rewards": list(failure.rewards),
        }
        self._filtered.setdefault(step, []).append(record)
        self.totals["filtered"] += 1

    def check_cap(self, step: int, failure: GroupFiltered) -> None:
        """DynamicSamplingCapExceeded (caused by ``failure``) when ``step`` may take no more extra generations."""
        if self._extra[step] >= self.extra_cap:
            raise DynamicSamplingCapExceeded(
                f"step {step}: {failure}; the step already took {self._extra[step]} extra generation(s), the cap of "
                f"(grpo.dynamic_sampling_max_gen_batches={self.max_gen_batches} - 1) x {self.groups_per_step}; "
                "raise the cap, or make the groups more diverse (more num_generations_per_prompt, a higher "
                "temperature, or a dataset of the model's difficulty)"
            ) from failure

    def refilled(self, step: int) -> None:
        """A fresh prompt took a filtered group's slot in ``step``: one extra generation."""
        self._extra[step] += 1
        self.totals["extra_generations"] += 1

    def close_step(self, step: int) -> tuple[tuple[dict[str, Any], ...], int]:
        """Step ``step`` trained: its filtered groups' records (prompt_index, prompt_id, group_id, ``filtered``: the
        reason, rewards) and its extra generations; forget every step up to it."""
        closed = tuple(self._filtered.get(step, ())), self._extra[step]
        for ledger in (self._filtered, self._extra):
            for key in [k for k in ledger if k <= step]:
                del ledger[key]
        return closed

    def state_dict(self) -> dict[str, Any]:
        """The run totals and the open steps' counts (JSON-able; keys as strings)."""
        return {
            "totals": dict(self.totals),
            "filtered": {str(step): list(records) for step, records in self._filtered.items()},
            "extra": {str(step): n for step, n in self._extra.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint without one restores nothing)."""
        self.totals = Counter({k: int(v) for k, v in state.get("totals", {}).items()})
        self._filtered = {int(step): list(records) for step, records in state.get("filtered", {}).items()}
        self._extra = Counter({int(step): int(n) for step, n in state.get("extra", {}).items()})


def refill_prompt(reserve: ReplacementReserve, prompts: Iterator[Sequence[Prompt]]) -> Prompt | None:
    """A fresh prompt for a filtered slot: a spare first, else the stream's next batch (the rest become spares).

    None once the dataset and the spares are exhausted. Synchronous: the stream's cursor and the spares agree at
    every await.
    """
    if not len(reserve):
        batch = next(prompts, None)
        if not batch:
            return None
        reserve.add(batch)
    return reserve.spares.popleft()
