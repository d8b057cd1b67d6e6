"""The stream of RL steps that Lightning iterates like a dataloader: one item = one RL step.

The stream is sized (``max_num_steps``), so Lightning never prefetches a step: the next step is requested only
after the previous one has trained and refit. Requesting a step waits for its first chunk (so an exhausted
dataset ends training cleanly); the step's other chunks are selected lazily, inside ``training_step``, as the
controller releases them — that is what lets a streamed step start training before all its groups are ready.

With several trainer ranks every rank runs the same stream: the selections come from the leader's controller
(:mod:`~sc_lightning.trainer.rank_sync`), so all ranks agree on each step's chunks, and each rank reads only its
data-parallel share of a chunk's rows (tensor- and pipeline-parallel peers read the same share).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from sc_lightning.config import SCConfig, resolve
from sc_lightning.controller.api import GroupMeta, WaitInterrupted
from sc_lightning.data_plane.base import DataPlane
from sc_lightning.trainer.chunks import Distillation, TrainChunk, load_chunk
from sc_lightning.trainer.data_parallel import data_parallel_rank, data_parallel_size, share_of_groups


class GroupSource(Protocol):
    """Where a step's groups come from: the controller, or (on a non-leader rank) the leader's broadcast."""

    def select(
        self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None
    ) -> list[GroupMeta] | None:
        """Wait for and take trainable groups; None once rollouts are exhausted."""


class RLStep(Protocol):
    """What the loop hands to training_step: the step's chunks, produced lazily as groups become ready."""

    version: int
    first_wait_s: float
    chunk_wait_s: float
    trained_rows: list[dict[str, Any]]  # this rank's, filled as chunks are trained, with data.train_data_log
    selected: list[GroupMeta]  # every group the step took, in the controller's order (all ranks alike)

    def chunks(self) -> Iterable[TrainChunk]:
        """This rank's share of each of the step's chunks of whole prompt groups (shares without rows are skipped)."""


class RolloutsExhausted(RuntimeError):
    """Rollouts ran out in the middle of a step, so the step cannot be assembled."""


@dataclass
class StepSettings:
    """How a step is assembled from the controller."""

    groups_per_step: int
    min_groups: int
    select_timeout_s: float
    pad_token_id: int
    overlong_filtering: bool
    leave_one_out: bool
    normalize_rewards: bool
    log_rows: bool = False
    with_images: bool = False  # a vision-language policy: each row's pixel_values too
    distillation: Distillation | None = None  # on-policy distillation: the opd advantages from the teacher fields

    @classmethod
    def from_config(cls, config: SCConfig, *, pad_token_id: int) -> StepSettings:
        """The step settings a config implies."""
        resolved = resolve(config)
        estimator = config.algo.adv_estimator
        return cls(
            groups_per_step=resolved.groups_per_step,
            min_groups=resolved.min_groups_for_streaming_train,
            select_timeout_s=config.async_rl.stall_watchdog.stall_timeout_s,
            pad_token_id=pad_token_id,
            overlong_filtering=config.algo.overlong_filtering,
            leave_one_out=getattr(estimator, "use_leave_one_out_baseline", True),
            normalize_rewards=getattr(estimator, "normalize_rewards", True),
            log_rows=config.data.train_data_log,
            with_images=config.policy.is_vlm,
            distillation=Distillation(
                reward_weight=estimator.reward_weight,
                full_vocabulary=config.on_policy_distillation.full_vocabulary,
            )
            if config.distills
            else None,
        )


class RLStepBatch:
    """One RL step as a lazily assembled sequence of chunks (whole prompt groups)."""

    def __init__(
        self,
        client: GroupSource,
        data_plane: DataPlane,
        settings: StepSettings,
        version: int,
        first: list[GroupMeta],
        waited_s: float = 0.0,
    ) -> None:
        self.client, self.data_plane, self.settings, self.version = client, data_plane, settings, version
        self._first = first
        self.groups = 0
        self.first_wait_s = waited_s  # waiting for the first chunk, before training_step starts
        self.chunk_wait_s = 0.0  # waiting for later chunks, inside training_step
        self.trained_rows: list[dict[str, Any]] = []  # with settings.log_rows: the tags and reward of each row
        self.selected: list[GroupMeta] = []  # every group taken so far, in the controller's order
        self.device = torch.device("cpu")  # where the chunks go: Lightning sets it through :meth:`to`

    def to(self, device: torch.device | str) -> RLStepBatch:
        """Deliver the chunks on ``device`` (Lightning's batch transfer calls this with the strategy's device)."""
        self.device = torch.device(device)
        return self

    def chunks(self) -> Iterator[TrainChunk]:
        """Yield chunks until the step holds ``groups_per_step`` groups, or fewer if the controller closes it short
        (dropped rollouts shrank it: ``select`` returns no groups)."""
        groups: list[GroupMeta] | None = self._first
        need = self.settings.groups_per_step
        while groups is not None:
            if not groups:
                return  # closed short
            self.selected += groups
            if share := share_of_groups(groups, data_parallel_rank(), data_parallel_size()):
                yield from self._train_share(share)
            self.groups += len(groups)
            if self.groups >= need:
                return
            left = need - self.groups
            started = time.monotonic()
            groups = self.client.select(
                self.version, min(self.settings.min_groups, left), left, timeout_s=self.settings.select_timeout_s
            )
            self.chunk_wait_s += time.monotonic() - started
        raise RolloutsExhausted(f"step {self.version}: rollouts ran out with {self.groups} of {need} groups assembled")

    def _train_share(self, share: list[GroupMeta]) -> Iterator[TrainChunk]:
        """Load this rank's share of a chunk, yield it, and (with ``log_rows``) record its rows once trained."""
        chunk = self._load(share)
        tags = self.data_plane.tags([key for group in share for key in group.keys]) if self.settings.log_rows else None
        yield chunk
        if tags is not None:
            rewards = chunk.rewards.tolist()  # one device sync for the whole chunk
            self.trained_rows += [{**tag, "reward": r} for tag, r in zip(tags, rewards, strict=True)]

    @property
    def exposed_generation_s(self) -> float:
        """Time the trainer waited for rollouts during this step."""
        return self.first_wait_s + self.chunk_wait_s

    def _load(self, groups: list[GroupMeta]) -> TrainChunk:
        s = self.settings
        chunk = load_chunk(
            self.data_plane,
            groups,
            pad_token_id=s.pad_token_id,
            overlong_filtering=s.overlong_filtering,
            leave_one_out=s.leave_one_out,
            normalize_rewards=s.normalize_rewards,
            with_images=s.with_images,
            distillation=s.distillation,
        )
        return chunk.to(self.device)


class RLStepStream:
    """A sized iterable of RL steps over a running controller; Lightning treats it as the train dataloader."""

    def __init__(
        self,
        client: GroupSource,
        data_plane: DataPlane,
        settings: StepSettings,
        *,
        max_steps: int,
        version: Callable[[], int],
    ) -> None:
        self.client, self.data_plane, self.settings = client, data_plane, settings
        self.max_steps = max_steps
        self.version = version

    def __len__(self) -> int:
        return self.max_steps

    def state_dict(self) -> dict[str, Any]:
        """Nothing of its own: where the stream stands is the trainer's ``global_step`` and the controller's state,
        which sc_lightning's bundles save (so Lightning may treat the stream as resumable mid-epoch)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see :meth:`state_dict`)."""

    def __iter__(self) -> Iterator[RLStepBatch]:
        """The RL steps: each waits for its first chunk. The stream ends when the rollouts run out, or when a stop
        signal ends that wait (:class:`WaitInterrupted`: the fit then ends after its last finished step, with its
        bundle); a stop signal while a step waits for a later chunk ends the fit inside the step, without one."""
        while True:
            version = self.version()
            s = self.settings
            started = time.monotonic()
            try:
                first = self.client.select(
                    version, min(s.min_groups, s.groups_per_step), s.groups_per_step, timeout_s=s.select_timeout_s
                )
            except WaitInterrupted:
                return
            if first is None:
                return  # the dataset is exhausted and the buffer drained
            yield RLStepBatch(self.client, self.data_plane, s, version, first, time.monotonic() - started)
