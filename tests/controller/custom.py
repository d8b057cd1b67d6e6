"""Custom sampler classes for the custom-mode tests."""

from __future__ import annotations

from sc_lightning.controller.samplers import InOrderSampler, WindowedSampler


class LatestOnly(WindowedSampler):
    """A complete custom sampler: the windowed policy with a ``keep`` knob of its own."""

    def __init__(self, buffer, *, keep: int) -> None:
        super().__init__(buffer, max_staleness_versions=keep, sample_freshest_first=True)
        self.keep = keep


class Incomplete:
    """Has a cursor but none of the sampling methods."""

    def __init__(self, buffer) -> None:
        self.buffer = buffer
        self.dispatch_index = -1
        self.is_on_policy = True


class NoReplayInOrder(InOrderSampler):
    """in_order, but declaring no buffer-checkpoint support: its checkpoints regenerate buffered groups."""

    supports_buffer_checkpoint = False
    supports_training_claims = False


class RaisesInSelect(InOrderSampler):
    """in_order whose select breaks from a given step on (a bug in user code)."""

    def __init__(self, buffer, *, from_step: int = 0, gate_window: int = 0) -> None:
        super().__init__(buffer, gate_window=gate_window)
        self.from_step = from_step

    async def select(self, *, trainer_version: int, min_groups: int, max_groups: int):
        """Break at ``from_step`` and after."""
        if trainer_version >= self.from_step:
            raise KeyError("no such slot")
        return await super().select(trainer_version=trainer_version, min_groups=min_groups, max_groups=max_groups)


class RaisesInAdmit(InOrderSampler):
    """in_order whose admit breaks on the second batch."""

    def admit(self):
        """Break once a batch was admitted."""
        if self.dispatch_index >= 0:
            raise ZeroDivisionError("division by zero")
        return super().admit()


class SelectsTooMany(InOrderSampler):
    """in_order that ignores max_groups."""

    async def select(self, *, trainer_version: int, min_groups: int, max_groups: int):
        """Take every eligible group, whatever max_groups says."""
        eligible = self.eligible(trainer_version)
        return self.buffer.take(eligible) if len(eligible) >= min_groups else None
