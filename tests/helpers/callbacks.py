"""Callbacks a test's ``fit`` process loads through ``--trainer.callbacks+=tests.helpers.callbacks.NAME`` (the child
starts from the repository root, so ``tests`` imports there)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class BundleHoldsABufferedGroup(Callback):
    """Each bundle's cut waits until the buffer holds a committed group that no step has claimed.

    A bundle is cut right after its step's refit, while the pump generates the next step's groups: whether one of
    them is committed by the cut is a race. A test that needs a buffered group in the bundle (a group-size refusal)
    adds this callback. ``on_save_checkpoint`` runs inside the bundle's ``trainer.save_checkpoint``, before the
    controller's snapshot, so the snapshot indexes that group.
    """

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Poll the controller's counts until a group is ready, for at most ``timeout_s``."""
        controller = trainer.strategy.rollout_side.controller
        deadline = time.monotonic() + self.timeout_s
        while controller.stats().ready < 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no buffered group after {self.timeout_s} s at step {trainer.global_step}'s cut")
            time.sleep(0.005)


class CutAfterAStall(Callback):
    """While ``$SC_TEST_STALL`` exists, each bundle's cut waits until an environment has stalled on it (its
    ``.stalled`` sibling exists): with :class:`tests.helpers.stalling_env.StallingCalculator` a conversation is then
    in flight with its first turn sealed, so the bundle's pending groups hold it."""

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Poll for the ``.stalled`` file while the stall file exists, for at most ``timeout_s``."""
        stall = Path(os.environ["SC_TEST_STALL"])
        deadline = time.monotonic() + self.timeout_s
        while stall.exists() and not stall.with_suffix(".stalled").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no environment stalled after {self.timeout_s} s at step {trainer.global_step}")
            time.sleep(0.005)


def image_summary(pixels: Any) -> list[list[int]]:
    """A row's images ``(N, H, W, 3)`` uint8 as ``[[H, W, 3, pixel sum], ...]``: their shape and a checksum."""
    return [[*image.shape, int(image.sum())] for image in pixels]


class TrainedTokens(Callback):
    """Writes every row the policy trains to ``<trainer.default_root_dir>/trained_tokens.jsonl``: one line per row,
    ``{"step", "input_ids", "token_mask", "logprobs", "token_versions", "images"}`` (right-padded; the mask marks the
    completion's tokens, ``logprobs`` are the engine's, ``token_versions`` None when the rows hold none; ``images``
    the row's images as ``[[H, W, 3, pixel sum], ...]``, None for a text policy).

    The step's chunks are produced lazily inside ``training_step``, so the callback wraps the step's ``chunks`` and
    records each chunk as it is handed to training.
    """

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Record the chunks of this step (``batch`` is the RL step) as training takes them."""
        chunks, path, step = batch.chunks, Path(trainer.default_root_dir) / "trained_tokens.jsonl", trainer.global_step

        def recorded() -> Iterator[Any]:
            for chunk in chunks():
                versions = [None] * len(chunk) if chunk.token_versions is None else chunk.token_versions.tolist()
                images = [None] * len(chunk) if chunk.pixel_values is None else map(image_summary, chunk.pixel_values)
                columns = (chunk.input_ids.tolist(), chunk.token_mask.tolist(), chunk.generation_logprobs.tolist())
                with path.open("a") as out:
                    for i, m, lp, v, im in zip(*columns, versions, images, strict=True):
                        row = {"step": step, "input_ids": i, "token_mask": m, "logprobs": lp, "token_versions": v}
                        out.write(json.dumps({**row, "images": im}) + "\n")
                yield chunk

        batch.chunks = recorded
