"""The generation-engine contract: sample completions asynchronously, take new weights, stand down, shut down."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import torch

from sc_lightning.types import Generation, SamplingParams


class EngineError(RuntimeError):
    """A generation request failed inside the engine; the message names the engine and the request."""


@runtime_checkable
class GenerationEngine(Protocol):
    """An inference engine that the rollout pump drives one request at a time, many requests concurrently."""

    name: str

    @property
    def weight_version(self) -> int:
        """Version of the weights currently loaded (the trainer step that produced them)."""

    async def generate(self, prompt_token_ids: tuple[int, ...], sampling: SamplingParams) -> Generation:
        """Sample one completion of the prompt; the result records the weight version that produced it."""

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights (all of them, or the last bucket after :meth:`stage_weights`) and adopt ``version``;
        requests in flight continue on the new weights."""

    async def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load one bucket of ``version``'s HF-named weights, more to follow; ``weight_version`` stays until the
        :meth:`update_weights` that brings the last bucket, and no token is sampled from a half-loaded model
        meanwhile (requests in flight wait). A bucket holds whole modules (see ``export_hf_units``)."""

    async def stand_down(self) -> None:
        """Release the accelerator for training (colocated engines); in-flight requests pause until ``wake``."""

    async def wake(self) -> None:
        """Take the accelerator back after ``stand_down``; paused requests resume."""

    async def shutdown(self) -> None:
        """Stop the engine and free its resources; idempotent."""
