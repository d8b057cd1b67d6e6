"""SingleController: the rollout pump plus the train-side API the train pump calls, on one event loop.

    rollout pump:  for batch in prompts (then, once every dataset rollout has committed or dropped, the
                   replacement reserve's spares, a step at a time):
                       wait until sampler.can_admit(trainer_version)
                       (replace mode) divert the batch into the replacement reserve while it is short
                       target = sampler.admit()
                       for prompt in batch:
                           take a slot: a buffer permit (max_buffered_rollouts), an in-flight permit
                           (max_inflight_prompts) and a pass through the dispatch gate (closed during a refit)
                           spawn generate_and_push(prompt, target)   # reserve → generate → score → commit
                           a group whose retries are spent is dropped within the drop budgets (drops.py):
                           a spare takes its place, or its step shrinks; with dynamic sampling a group whose
                           rewards are all equal is filtered and a fresh prompt takes its slot (dynamic_sampling.py)
    train side:    evict(v)              drop groups that can never be trained (frees their permits)
                   select(v, min, max)   wait for and take ready groups (frees their permits); metadata only;
                                         they are the step's *training claims*
                   begin_refit(v + 1)    close dispatch, abort rollouts the sampler says are doomed, (drain gate)
                                         wait for the rest to finish, release the claims (delete their rows and
                                         evicted groups' rows)
                   push_weights(w, v+1)  load the trainer's new weights into the engine (once, or bucket by
                                         bucket: the engine adopts v + 1 with the last)
                   finish_refit(v + 1)   stamp the engine's new version, reopen dispatch

A dispatched group holds a *slot* (``admission.py``), taken in ``_launch`` and ended once in the rollout's
``finally`` (or by the task's done callback if it never ran); a committed group keeps the slot's buffer permit until
it is selected or evicted. A selected group's rows stay in the data plane until its step publishes its weights
(begin_refit), so a rollout snapshot taken mid-step still holds them and a resume replays the step. No Lightning
here: the same object runs in a Ray actor or on a background thread (``runners.py``).

One file for one state machine: the pump and the train side share a condition, the slots and the ledger, and each
half's invariants are the other's (select waits on commits; begin_refit closes the pump's gate and aborts its
rollouts). Every other concern has a file: ``parts.py`` (what it is built from), ``admission.py``, ``refit_gate.py``
(the drain gate, the refit's deadline), ``refill.py`` (dropped and filtered groups' replacements), ``ledger.py``,
``checkpointing.py`` and ``supervisor.py`` (the background tasks and their failures).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from sc_lightning.controller.admission import Admission, Slot
from sc_lightning.controller.api import (
    ControllerCounts,
    ControllerStats,
    GroupMeta,
    RefitReport,
    SelectTimeout,
    StepDrops,
    StepSurvivorship,
    ValidationResult,
    WaitInterrupted,
)
from sc_lightning.controller.checkpointing import ControllerCheckpoint
from sc_lightning.controller.drops import DropLedger
from sc_lightning.controller.dynamic_sampling import zero_reward_variance
from sc_lightning.controller.ledger import RecoveryLedger
from sc_lightning.controller.parts import ControllerParts, ControllerSettings
from sc_lightning.controller.recovery import PendingGroup
from sc_lightning.controller.refill import SlotRefill
from sc_lightning.controller.refit_gate import RefitGate
from sc_lightning.controller.supervisor import TaskSupervisor
from sc_lightning.controller.survivorship import SurvivorshipTally
from sc_lightning.data_plane.base import DataPlane
from sc_lightning.rollout.manager import GroupFiltered, RolloutError

log = logging.getLogger(__name__)


class SingleController:
    """Owns the buffer, sampler, served policy, rollout manager and prompt stream; runs the rollout pump; serves
    the trainer. Its recovery ledger is shared with its admission, refill and checkpoint collaborators."""

    def __init__(self, parts: ControllerParts, settings: ControllerSettings) -> None:
        """``parts.manager.served`` is the engine and the version new rollouts are stamped with: the controller
        advances it at each refit; the manager only reads it."""
        self.buffer, self.sampler, self.prompts = parts.buffer, parts.sampler, parts.prompts
        self.manager, self.served, self.reserve = parts.manager, parts.manager.served, parts.reserve
        self.dynamic, self.validator = parts.dynamic_sampling, parts.validator
        self.settings, self.recovery, self.drops = settings, settings.recovery, DropLedger(settings.drop_budgets)
        if self.dynamic is not None:
            self.manager.group_filter = zero_reward_variance
        self._sampler_has_stamped = False  # learned from admit(), so custom samplers work too
        self._last_step_drops = StepDrops()
        self.survivorship, self._last_survivorship = SurvivorshipTally(), StepSurvivorship()
        self._selected_for: Counter[int] = Counter()  # groups selected so far, by the step they were selected for
        self._warmup_window = settings.warmup_window
        self.trainer_version = self.served.version
        self._changed = asyncio.Condition()
        self.ledger = RecoveryLedger()
        self.admission = Admission(settings.max_buffered_rollouts, settings.max_inflight_prompts, self.ledger)
        self.refit_gate = RefitGate(self.admission.gate, self.manager, self.sampler, settings.drain_timeout_s)
        self.refill = SlotRefill(parts, self.recovery, self.drops, self.ledger, self._notify)
        self.checkpoints = ControllerCheckpoint(
            parts, self.recovery, self.drops, self.admission.buffer_permits, self.ledger
        )
        self.counts = ControllerCounts()
        self.tasks = TaskSupervisor(self._notify)  # the pump and the background tasks, and the first to fail
        self._pump: asyncio.Task | None = None
        self._exhausted = False
        self._waits_interrupted = False  # a stop signal came: the trainer waits for no more rollouts
        self._last_progress = time.monotonic()
        self._background: list[tuple[str, Callable[[SingleController], Awaitable[None]]]] = []

    # ------------------------------------------------------------------------------------------ rollout pump

    def add_background_task(self, name: str, run: Callable[[SingleController], Awaitable[None]]) -> None:
        """Run ``run(self)`` beside the pump from :meth:`start` on (e.g. periodic rollout snapshots).

        If it fails, the trainer's next call raises that failure, named ``name``, as it would a pump failure.
        """
        self._background.append((name, run))

    async def start(self) -> None:
        """Start the rollout pump, and the background tasks, in the background."""
        if self._pump is None:
            self._pump = self.tasks.start("rollout pump", self._rollout_pump(), task_name="rollout-pump")
            for name, run in self._background:
                self.tasks.start(name, run(self))

    async def _rollout_pump(self) -> None:
        async with asyncio.TaskGroup() as group:
            for sequence, entry in self.ledger.open_resumed():  # a restored checkpoint's pending prompts first
                await self._launch(group, entry, sequence)
            while True:
                await self._wait_for_admission()
                batch = next(self.prompts, None)  # taken only once admitted, so the cursor never runs ahead
                if batch is None:
                    break
                if self.reserve.wants_batch(self._sampler_has_stamped):
                    self.reserve.add(batch)  # no await since next(): the cursor and the reserve agree
                    continue
                await self._admit(group, batch)
            if len(self.reserve):  # spares stay available until every dataset rollout has committed or dropped
                async with self._changed:  # (each rollout is bounded by its own deadlines)
                    await self._changed.wait_for(lambda: not self.ledger.pending)
            while True:  # the dataset is exhausted: the spares left are trained as whole steps
                await self._wait_for_admission()
                spares = self.reserve.take_step(self.drops.budgets.groups_per_step)
                if spares is None:
                    break
                await self._admit(group, spares)
            if len(self.reserve):
                log.warning("%d spare prompt(s) left, fewer than a step: not trained", len(self.reserve))
        async with self._changed:
            self._exhausted = True
            self._changed.notify_all()

    async def _wait_for_admission(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.sampler.can_admit(self.trainer_version))

    async def _admit(self, group: asyncio.TaskGroup, batch: Sequence[Any]) -> None:
        """Admit one batch of prompts (a target step when the sampler stamps one) and launch its groups."""
        target = self.sampler.admit()
        self._sampler_has_stamped |= target is not None
        for sequence, entry in self.ledger.open([self.recovery.pending(prompt, target) for prompt in batch]):
            await self._launch(group, entry, sequence)

    async def _launch(self, group: asyncio.TaskGroup, entry: PendingGroup, sequence: int) -> None:
        slot = await self.admission.acquire(sequence)  # the slot starts here ...
        task = group.create_task(self._dispatch_one(entry, slot), name=f"rollout {entry.prompt.prompt_id}")
        task.add_done_callback(lambda _: slot.release())  # ... and ends here if the task was cancelled before it ran
        self.counts.dispatched += 1
        await self._notify()

    async def _dispatch_one(self, entry: PendingGroup, slot: Slot) -> None:
        spares = 0  # spares that took a dropped group's place in this slot
        try:
            while True:
                try:
                    # with token capture the manager seals finished generations into entry.sealed and a
                    # conversation's turns into entry.conversations (and reuses them)
                    meta = await self.manager.generate_and_push(
                        entry.prompt,
                        target_step=entry.target_step,
                        sealed=entry.sealed,
                        conversations=entry.conversations,
                    )
                    break
                except (RolloutError, GroupFiltered) as failure:
                    if isinstance(failure, GroupFiltered):  # no advantage: consumed, a fresh prompt takes the slot
                        replacement = self.refill.after_filter(failure, entry, slot.sequence, self.trainer_version)
                    else:  # its retries are spent
                        replacement = await self.refill.after_drop(
                            failure, entry, spares, slot.sequence, self.trainer_version
                        )
                        spares += 1
                    if replacement is None:
                        return  # dropped, or filtered with no prompt left; its step shrinks
                    entry = replacement
                    await slot.pass_gate_again()
            slot.commit()  # the buffer permit now belongs to the group until it is selected or evicted
            self.ledger.commit(slot.sequence, meta.group_id, entry)  # no await since the buffer's commit: one cut
            self._last_progress = time.monotonic()
            self.counts.committed += 1
            self.survivorship.add("committed", [meta])
            self.drops.on_commit()
            if spares and meta.target_step is not None:  # spares replace stamped groups only
                self.drops.replaced(meta.target_step)
        except asyncio.CancelledError:
            if self.refit_gate.aborting:  # aborted by a refit (doomed by the sampler): dropped on purpose, not pending
                self.ledger.forget(slot.sequence)
            raise
        finally:
            slot.release()  # ... or here: the slot ends once, whatever became of the rollout
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``predicate()`` holds, re-checking whenever the controller's state changes."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout_s)

    # ------------------------------------------------------------------------------------------ train side

    async def evict(self, trainer_version: int) -> list[GroupMeta]:
        """Drop groups the sampler can no longer train at ``trainer_version``; their permits are freed."""
        self.tasks.raise_if_failed()
        evicted = await self.sampler.evict(trainer_version=trainer_version)
        self.admission.release_committed(len(evicted))
        self.counts.evicted += len(evicted)
        self.survivorship.add("evicted", evicted)
        self.manager.goodput.evicted(group.group_id for group in evicted)
        self.ledger.drop_committed(evicted)
        return evicted

    async def select(
        self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None
    ) -> list[GroupMeta] | None:
        """Wait for and take ``min_groups``..``max_groups`` trainable groups; None once rollouts are exhausted.

        An empty list: the step already holds every group it will get (dropped groups shrank it), so it closes.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        async with self._changed:
            while True:
                self.tasks.raise_if_failed()
                await self.evict(trainer_version)
                left = self.drops.target_groups(trainer_version) - self._selected_for[trainer_version]
                if left <= 0:
                    return []  # dropped groups shrank the step and it holds what is left: it closes short
                chosen = await self.sampler.select(
                    trainer_version=trainer_version,
                    min_groups=min(min_groups, left),
                    max_groups=min(max_groups, left),
                )
                if chosen:
                    self.admission.release_committed(len(chosen))
                    self.counts.selected += len(chosen)
                    self.survivorship.add("trained", chosen)
                    self.manager.goodput.trained(group.group_id for group in chosen)
                    self.ledger.claim(chosen)
                    self._selected_for[trainer_version] += len(chosen)
                    return chosen
                if self._exhausted and not self.manager.inflight:
                    return None
                await self._wait(deadline, trainer_version, min_groups)

    async def interrupt_waits(self) -> None:
        """A stop signal: the trainer's waits for rollouts, now and later, end in WaitInterrupted (selecting none)."""
        self._waits_interrupted = True
        await self._notify()

    async def _wait(self, deadline: float | None, trainer_version: int, min_groups: int) -> None:
        if self._waits_interrupted:  # only here, where select holds no groups: none is lost
            raise WaitInterrupted(f"step {trainer_version}: a stop signal ended the wait for rollouts")
        remaining = None if deadline is None else deadline - time.monotonic()
        try:
            await asyncio.wait_for(self._changed.wait(), remaining)
        except TimeoutError:
            stats = self.stats()
            raise SelectTimeout(
                f"step {trainer_version}: waited past the deadline for {min_groups} trainable group(s); "
                f"{stats.ready} ready, {stats.inflight} in flight, {stats.buffered} buffered"
            ) from None

    async def begin_refit(self, next_version: int) -> int:
        """The step is trained: close dispatch, abort doomed rollouts, drain the rest (drain gate), release the
        step's claims (delete their rows).

        Returns how many in-flight rollouts were aborted. The drain gate raises DrainTimeout past its deadline. A
        validation of the step still running is settled first (its version is pinned), while rollouts still flow.
        """
        await self._settle_validation()
        aborted = await self.refit_gate.close(next_version)  # dispatch closes; doomed rollouts are cancelled
        self.counts.aborted += aborted
        await self.refit_gate.drain(step=next_version - 1)
        async with self.ledger.claims_lock:
            self._last_step_drops = self.drops.close_step(next_version - 1)
            self._last_survivorship = self.survivorship.close_step()
            if self.dynamic is not None:
                filtered, extra = self.dynamic.close_step(next_version - 1)
                self._last_step_drops = replace(self._last_step_drops, filtered=filtered, extra_generations=extra)
            self._selected_for = Counter({v: n for v, n in self._selected_for.items() if v >= next_version})
            claims = self.ledger.release_claims()
            await self.buffer.delete_rows(claims)  # and the rows of groups evicted meanwhile
            self.trainer_version = next_version
        self.refit_gate.restart_deadline()
        return aborted

    async def stand_down_engine(self) -> None:
        """Colocated engine: release the accelerator for the train step (in-flight requests pause).

        Under the drain gate, dispatch closes (until finish_refit) and the rollouts in flight finish first.
        """
        await self._settle_validation()
        await self.refit_gate.drain_before_stand_down(step=self.trainer_version)
        await self.served.engine.stand_down()
        self.manager.goodput.stand_down()

    async def wake_engine(self) -> None:
        """Colocated engine: take the accelerator back after the train step (paused requests resume)."""
        self.manager.goodput.wake()
        await self.served.engine.wake()

    async def push_weights(
        self, named_tensors: list[tuple[str, torch.Tensor]], version: int, *, last: bool = True
    ) -> None:
        """Load new weights into the generation engine (between begin_refit and finish_refit), under a deadline.

        ``last=False``: one bucket of them, more follow; the engine adopts ``version`` with the last bucket (or the
        whole set). One deadline, ``refit_timeout_s``, holds for all of a version's buckets together."""
        await self.refit_gate.push_weights(named_tensors, version, last=last)

    async def finish_refit(self, version: int) -> None:
        """The engines now hold ``version``: stamp it on new rollouts and reopen dispatch."""
        self.trainer_version = self.served.version = version
        self._last_progress = time.monotonic()  # a step completed
        self._end_warmup_window()
        self.refit_gate.open()
        if self.validator is not None and self.validator.settings.due(version):
            self.validator.start(version, self.served.engine)
        await self._notify()

    # ------------------------------------------------------------------------------------------ validation

    async def validate(self, step: int) -> None:
        """Start validating ``step`` now, at the version the engine holds (a resumed step's, or version 0)."""
        if self.validator is None:
            raise RuntimeError("this controller has no validator (validation is off in its config)")
        if step != self.trainer_version:
            raise ValueError(f"step {step}: the engine holds weight version {self.trainer_version}, not {step}")
        await self._settle_validation()
        self.validator.start(step, self.served.engine)

    def validation_results(self) -> list[ValidationResult]:
        """The validations finished since the last call (none without a validator)."""
        return [] if self.validator is None else self.validator.take_results()

    async def settle_validation(self) -> list[ValidationResult]:
        """Wait for the validation in flight; every validation finished since the last call."""
        await self._settle_validation()
        return self.validation_results()

    async def _settle_validation(self) -> None:
        if self.validator is not None:
            await self.validator.settle(self.served.engine)

    async def refit(
        self, version: int, named_tensors: list[tuple[str, torch.Tensor]] | None, *, wake: bool = False
    ) -> RefitReport:
        """The whole refit after step ``version - 1``, in one call: begin, push (unless None), wake, finish."""
        aborted = await self.begin_refit(version)
        if named_tensors is not None:
            await self.push_weights(named_tensors, version)
        if wake:
            await self.wake_engine()
        await self.finish_refit(version)
        return RefitReport(aborted, self.stats())

    # ------------------------------------------------------------------------------------------ checkpoints

    @property
    def data_plane(self) -> DataPlane:
        """The data plane holding the committed groups' rows."""
        return self.buffer.data_plane

    def checkpoint_barrier(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Inside: trainer_version, the claims, the committed groups and the data plane's rows stay put."""
        return self.checkpoints.barrier()

    def checkpoint_state(self, *, index_rows: bool = True) -> dict[str, Any]:
        """The controller's cut (see :meth:`ControllerCheckpoint.state`); take it inside :meth:`checkpoint_barrier`."""
        return self.checkpoints.state(self.trainer_version, index_rows=index_rows)

    async def snapshot(self, directory: str | Path | None) -> dict[str, Any]:
        """Write the data plane's rows into ``directory`` and return :meth:`checkpoint_state` — at any moment (see
        :meth:`ControllerCheckpoint.snapshot`)."""
        return await self.checkpoints.snapshot(directory, lambda: self.trainer_version)

    async def restore(self, state: dict[str, Any], *, group_size: int) -> None:
        """Load a :meth:`checkpoint_state` before :meth:`start` (the committed groups' rows already in the data plane).

        Raises ValueError naming what does not fit (state version, prompt stream settings, replay index, capacity).
        """
        if self._pump is not None:
            raise RuntimeError("restore() must come before start()")
        self.trainer_version = self.served.version = await self.checkpoints.restore(state, group_size=group_size)
        self._end_warmup_window()  # a resume after the warm-up is back to the normal lookahead

    def _end_warmup_window(self) -> None:
        if self._warmup_window is not None and self.trainer_version >= self._warmup_window[0]:
            self.sampler.set_gate_window(self._warmup_window[1])
            self._warmup_window = None

    def stats(self) -> ControllerStats:
        """A snapshot of the counters."""
        return ControllerStats(
            trainer_version=self.trainer_version,
            dispatch_index=self.sampler.dispatch_index,
            inflight=len(self.manager.inflight),
            buffered=len(self.buffer),
            ready=len(self.buffer.ready_metas()),
            buffer_permits_held=self.admission.buffer_permits.held,
            exhausted=self._exhausted,
            idle_s=time.monotonic() - self._last_progress,
            infra_failures=self.manager.failures["infra"],
            data_failures=self.manager.failures["data"],
            redispatched=self.manager.failures["redispatched"],
            dropped=self.drops.totals["dropped"],
            replaced=self.drops.totals["replaced"],
            promoted=self.drops.totals["promoted"],
            filtered=0 if self.dynamic is None else self.dynamic.totals["filtered"],
            extra_generations=0 if self.dynamic is None else self.dynamic.totals["extra_generations"],
            last_step=self._last_step_drops,
            survivorship=self._last_survivorship,
            engine_time=self.manager.goodput.snapshot(),
            **asdict(self.counts),
        )

    async def shutdown(self) -> None:
        """Stop the background tasks and the pump (in-flight rollouts are cancelled, slots removed), then the engine."""
        if self.validator is not None:
            self.validator.cancel()
        await self.tasks.cancel()
        await self.served.engine.shutdown()
