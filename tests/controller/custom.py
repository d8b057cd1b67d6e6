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
