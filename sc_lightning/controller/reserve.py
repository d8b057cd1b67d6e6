"""The replacement reserve: spare prompts that take the place of dropped prompt groups (``on_dropped_prompt: replace``).

The rollout pump keeps the reserve at ``replacement_reserve_prompts`` or more by diverting whole dataset batches
into it instead of admitting them — only after the sampler has stamped a target step once, so the first batch is
always trained and no target step is burned by a diverted batch. When a stamped group is dropped, its dispatch takes
spares (at most ``max_replacement_attempts`` per dropped slot); without one, its step shrinks. Once the dataset is
exhausted and every dataset rollout has committed or been dropped, the spares left are dispatched as whole steps of
their own; a remainder smaller than a step is not trained (logged). The reserve is saved with the prompt stream's
cursor in every checkpoint (``replacement_reserve.pt``), so no spare is lost or repeated by a resume.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sc_lightning.types import Prompt, prompt_from_dict, prompt_to_dict


@dataclass
class ReplacementReserve:
    """A FIFO pool of spare prompts; ``size`` 0 (shrink mode) keeps it empty."""

    size: int = 0
    max_attempts_per_slot: int = 0
    spares: deque[Prompt] = field(default_factory=deque)

    def wants_batch(self, sampler_has_stamped: bool) -> bool:
        """Whether the next dataset batch should be diverted into the reserve instead of admitted."""
        return self.size > 0 and sampler_has_stamped and len(self.spares) < self.size

    def add(self, batch: Sequence[Prompt]) -> None:
        """Hold a diverted dataset batch as spares."""
        self.spares.extend(batch)

    def take(self, attempts_so_far: int) -> Prompt | None:
        """A spare for a dropped slot that has used ``attempts_so_far`` spares, or None (the step shrinks)."""
        if attempts_so_far >= self.max_attempts_per_slot or not self.spares:
            return None
        return self.spares.popleft()

    def take_step(self, groups_per_step: int) -> list[Prompt] | None:
        """A whole step's worth of spares (after the dataset ran out), or None when fewer are left."""
        if len(self.spares) < groups_per_step:
            return None
        return [self.spares.popleft() for _ in range(groups_per_step)]

    def __len__(self) -> int:
        return len(self.spares)

    def state_dict(self) -> list[dict[str, Any]]:
        """The spares, in order, as plain data."""
        return [prompt_to_dict(prompt) for prompt in self.spares]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        """Restore :meth:`state_dict` (whatever the mode now: saved spares are still prompts owed training)."""
        self.spares = deque(prompt_from_dict(entry) for entry in state)
