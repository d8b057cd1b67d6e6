"""Callbacks a test's ``fit`` process loads through ``--trainer.callbacks+=tests.helpers.callbacks.NAME`` (the child
starts from the repository root, so ``tests`` imports there)."""

from __future__ import annotations

import json
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


class TrainedTokens(Callback):
    """Writes every row the policy trains to ``<trainer.default_root_dir>/trained_tokens.jsonl``: one line per row,
    ``{"step", "input_ids", "token_mask"}`` (right-padded ids; the mask marks the completion's tokens).

    The step's chunks are produced lazily inside ``training_step``, so the callback wraps the step's ``chunks`` and
    records each chunk as it is handed to training.
    """

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Record the chunks of this step (``batch`` is the RL step) as training takes them."""
        chunks, path, step = batch.chunks, Path(trainer.default_root_dir) / "trained_tokens.jsonl", trainer.global_step

        def recorded() -> Iterator[Any]:
            for chunk in chunks():
                rows = zip(chunk.input_ids.tolist(), chunk.token_mask.tolist(), strict=True)
                with path.open("a") as out:
                    out.writelines(json.dumps({"step": step, "input_ids": i, "token_mask": m}) + "\n" for i, m in rows)
                yield chunk

        batch.chunks = recorded
