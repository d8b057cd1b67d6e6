"""``PromptStream``: fixed-size batches of prompts over epochs, reshuffled per epoch, resumable from a state dict;
``check_dataset_fits_steps``: how a run's dataset divides into its RL steps, checked before anything starts."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sc_lightning.config.resume_rules import PROMPT_STREAM_VERSION, check_prompt_stream
from sc_lightning.rollout.dataset_base import DatasetError, PromptDataset
from sc_lightning.types import Prompt

if TYPE_CHECKING:
    from sc_lightning.config.schema import SCConfig

log = logging.getLogger(__name__)


def check_dataset_fits_steps(config: SCConfig, dataset_size: int) -> None:
    """DatasetError when the dataset holds fewer prompts than one RL step takes; a warning when each epoch leaves
    prompts out of its last, partial step (said only when the run reaches the end of an epoch)."""
    per_step, knob = config.algo.num_prompts_per_step, f"{config.algo_name}.num_prompts_per_step"
    name = config.data.dataset_name
    if dataset_size < per_step:
        raise DatasetError(
            f"the dataset {name!r} (data.dataset_name) holds {dataset_size} prompts, fewer than one RL step takes "
            f"({knob}={per_step}); set {knob} to at most {dataset_size}, or use {per_step} or more prompts"
        )
    steps, left_out = divmod(dataset_size, per_step)
    if left_out and config.algo.max_num_steps >= steps:
        log.warning(
            "each epoch of the dataset %r trains %d of its %d prompts: %d steps of %s=%d, and the last %d prompts of "
            "the epoch's order are not trained in that epoch (a different %d each epoch with data.shuffle); make the "
            "dataset size a multiple of %s to train every prompt every epoch",
            name,
            dataset_size - left_out,
            dataset_size,
            steps,
            knob,
            per_step,
            left_out,
            left_out,
            knob,
        )


class PromptStream:
    """Yields batches of exactly ``batch_size`` prompts for ``max_epochs`` epochs, then stops.

    Each epoch visits the dataset in an order that depends only on ``(seed, epoch)`` (the identity order when
    ``shuffle`` is false) and drops its last partial batch. The stream is its own iterator: ``epoch`` and
    ``position`` always name the *next* batch, so ``state_dict()`` taken after any batch and loaded into a fresh
    stream over the same dataset continues with exactly the batches an uninterrupted run would have yielded.
    """

    def __init__(self, dataset: PromptDataset, batch_size: int, *, shuffle: bool, seed: int, max_epochs: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_epochs < 1:
            raise ValueError(f"max_epochs must be >= 1, got {max_epochs}")
        if len(dataset) < batch_size:
            raise ValueError(f"the dataset has {len(dataset)} prompts, fewer than one batch of {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.max_epochs = max_epochs
        self._epoch = 0
        self._position = 0
        self._order_epoch = -1
        self._order: list[int] = []

    def __len__(self) -> int:
        """Batches per epoch (the last partial batch is dropped)."""
        return len(self.dataset) // self.batch_size

    @property
    def epoch(self) -> int:
        """Epoch of the next batch (0-based); equals ``max_epochs`` once the stream is exhausted."""
        return self._epoch

    @property
    def position(self) -> int:
        """Index of the next batch within its epoch."""
        return self._position

    @property
    def exhausted(self) -> bool:
        """Whether all ``max_epochs`` epochs have been yielded."""
        return self._epoch >= self.max_epochs

    @property
    def batches_yielded(self) -> int:
        """Batches yielded since the start of the run (resumed runs included)."""
        return self._epoch * len(self) + self._position

    def epoch_order(self, epoch: int) -> list[int]:
        """Dataset indices in the order epoch ``epoch`` visits them (a deterministic function of seed and epoch)."""
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(f"prompt-stream:{self.seed}:{epoch}").shuffle(order)
        return order

    def __iter__(self) -> Iterator[list[Prompt]]:
        return self

    def __next__(self) -> list[Prompt]:
        if self.exhausted:
            raise StopIteration
        if self._order_epoch != self._epoch:
            self._order = self.epoch_order(self._epoch)
            self._order_epoch = self._epoch
        start = self._position * self.batch_size
        batch = [self.dataset[i] for i in self._order[start : start + self.batch_size]]
        self._position += 1
        if self._position >= len(self):
            self._epoch += 1
            self._position = 0
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands (the next batch) and the settings a resume must match; plain JSON-able data."""
        return {
            "version": PROMPT_STREAM_VERSION,
            "epoch": self._epoch,
            "position": self._position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "dataset_size": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; ResumeMismatch when it was written with another seed, shuffle, batch or dataset
        size (:func:`~sc_lightning.config.resume_rules.check_prompt_stream`)."""
        settings = {"seed": self.seed, "shuffle": self.shuffle, "batch_size": self.batch_size}
        check_prompt_stream(state, **settings, dataset_size=len(self.dataset))
        self._epoch, self._position = int(state["epoch"]), int(state["position"])

    def __repr__(self) -> str:
        return (
            f"PromptStream(batch_size={self.batch_size}, shuffle={self.shuffle}, seed={self.seed}, "
            f"max_epochs={self.max_epochs}, epoch={self._epoch}, position={self._position})"
        )
