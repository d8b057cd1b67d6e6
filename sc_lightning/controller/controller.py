"""SingleController: the rollout pump plus the train-side API the train pump calls, on one event loop.

    rollout pump:  for batch in prompts (then, once every dataset rollout has committed or dropped, the
                   replacement reserve's spares, a step at a time):
                       wait until sampler.can_admit(trainer_version)
                       (replace mode) divert the batch into the replacement reserve while it is short
                       target = sampler.admit()
                       for prompt in batch:
                           take a buffer permit (max_buffered_rollouts) and an in-flight permit
                           (max_inflight_prompts); wait while a refit is running
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

A buffer permit is held by every dispatched group until it is selected or evicted, or its rollout fails, is
cancelled, or never starts; an in-flight permit only while its rollout runs. A selected group's rows stay in the
data plane until the step that trained them publishes its weights (begin_refit), so a rollout snapshot taken in
the middle of a step still holds them and a resume replays the step. The controller never imports
Lightning, so the same object runs in a Ray actor or on a background thread (see ``runners.py``).

One file (past 400 lines) for one state machine: the pump and the train side share a condition, the dispatch gate,
the permits and the ledger, and each half's invariants are the other's (select waits on commits; begin_refit closes
the pump's gate and aborts its rollouts). The ledger, the checkpoint cut and the dispatch gate are collaborators in
their own files.

The drain gate (``async_rl.in_flight_weight_updates: false``, ``drain_timeout_s`` here): begin_refit waits, under
its deadline, until no rollout that passed the dispatch gate is still generating, so every group starts and ends on
one weight version. A colocated engine drains before it stands down (its paused requests would otherwise straddle
the refit); dispatch then stays closed until finish_refit. The gate drains at every refit, a PPO critic warm-up's
too: the weights do not change there, but the version stamped on rollouts does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from sc_lightning.config.runtime import RolloutRecoveryConfig
from sc_lightning.controller.api import (
    ControllerStats,
    DrainTimeout,
    GroupMeta,
    RefitReport,
    RolloutPumpError,
    SelectTimeout,
    StepDrops,
    StepSurvivorship,
    ValidationResult,
)
from sc_lightning.controller.buffer import TQReplayBuffer
from sc_lightning.controller.checkpointing import ControllerCheckpoint
from sc_lightning.controller.dispatch_gate import DispatchGate
from sc_lightning.controller.drops import DropBudgets, DropLedger
from sc_lightning.controller.dynamic_sampling import DynamicSampling, refill_prompt, zero_reward_variance
from sc_lightning.controller.ledger import RecoveryLedger
from sc_lightning.controller.permits import Permits
from sc_lightning.controller.recovery import PendingGroup, RecoveryPolicy
from sc_lightning.controller.reserve import ReplacementReserve
from sc_lightning.controller.samplers import PromptGroupSampler
from sc_lightning.controller.survivorship import SurvivorshipTally
from sc_lightning.controller.validation import Validator
from sc_lightning.data_plane.base import DataPlane
from sc_lightning.engines.base import EngineError
from sc_lightning.rollout.failures import classify
from sc_lightning.rollout.manager import GroupFiltered, RolloutError, RolloutManager, ServedPolicy
from sc_lightning.rollout.prompts import PromptStream

log = logging.getLogger(__name__)


class SingleController:
    """Owns the buffer, sampler, served policy, rollout manager and prompt stream; runs the rollout pump; serves
    the trainer. Its recovery ledger is shared with its checkpoint collaborator."""

    def __init__(
        self,
        *,
        buffer: TQReplayBuffer,
        sampler: PromptGroupSampler,
        served: ServedPolicy,
        manager: RolloutManager,
        prompts: PromptStream,
        max_buffered_rollouts: int,
        max_inflight_prompts: int,
        recovery: RecoveryPolicy | None = None,
        warmup_window: tuple[int, int] | None = None,
        drop_budgets: DropBudgets | None = None,
        reserve: ReplacementReserve | None = None,
        drain_timeout_s: float | None = None,
        dynamic_sampling: DynamicSampling | None = None,
        validator: Validator | None = None,
    ) -> None:
        """``warmup_window = (start_step, lookahead)``: PPO critic warm-up — the sampler was built with the wider
        warm-up lookahead; once the trainer reaches ``start_step`` its gate window narrows to ``lookahead``.
        ``drop_budgets`` default to none (a group whose retries are spent stops the run); ``reserve`` to empty.
        ``served`` is the engine and the version new rollouts are stamped with: the controller advances it at each
        refit; ``manager`` (built over the same ``served``) only reads it. ``drain_timeout_s``: the drain gate's
        deadline (None: refits leave generations in flight, ``async_rl.in_flight_weight_updates: true``).
        ``dynamic_sampling``: filter zero-reward-variance groups and refill their slots (``dynamic_sampling.py``).
        ``validator``: validations pinned to one weight version each (``validation.py``); None: the run validates
        nothing."""
        if manager.served is not served:
            raise ValueError("the rollout manager must read the controller's served policy")
        self.buffer, self.sampler, self.served, self.manager, self.prompts = buffer, sampler, served, manager, prompts
        self.recovery = recovery or RecoveryPolicy(RolloutRecoveryConfig(), token_capture=False)
        self.drops = DropLedger(drop_budgets or DropBudgets(groups_per_step=prompts.batch_size))
        self.reserve = reserve if reserve is not None else ReplacementReserve()
        self.dynamic = dynamic_sampling
        if dynamic_sampling is not None:
            manager.group_filter = zero_reward_variance
        self._sampler_has_stamped = False  # learned from admit(), so custom samplers work too
        self._last_step_drops = StepDrops()
        self.survivorship, self._last_survivorship = SurvivorshipTally(), StepSurvivorship()
        self._selected_for: Counter[int] = Counter()  # groups selected so far, by the step they were selected for
        self._warmup_window = warmup_window
        self.buffer_permits = Permits(max_buffered_rollouts, "async_rl.max_buffered_rollouts")
        self.inflight_permits = Permits(max_inflight_prompts, "async_rl.max_inflight_prompts")
        self.trainer_version = served.version
        self._changed = asyncio.Condition()
        self.gate = DispatchGate()
        self.drain_timeout_s = drain_timeout_s
        self.validator = validator
        self._pump: asyncio.Task | None = None
        self._failure: BaseException | None = None
        self._exhausted = False
        self._counts = {"dispatched": 0, "committed": 0, "selected": 0, "evicted": 0, "aborted": 0}
        self._last_progress = time.monotonic()
        self.ledger = RecoveryLedger()
        self.checkpoints = ControllerCheckpoint(
            buffer,
            sampler,
            prompts,
            self.recovery,
            self.drops,
            self.reserve,
            self.buffer_permits,
            self.ledger,
            self.dynamic,
        )
        self._aborting = False
        self._refit_engine_s: dict[int, float] = {}  # the engine's time so far on the refit to a version
        self._background: list[tuple[str, Callable[[SingleController], Awaitable[None]]]] = []
        self._background_tasks: list[asyncio.Task] = []
        self._failed_part = "rollout pump"

    # ------------------------------------------------------------------------------------------ rollout pump

    def add_background_task(self, name: str, run: Callable[[SingleController], Awaitable[None]]) -> None:
        """Run ``run(self)`` beside the pump from :meth:`start` on (e.g. periodic rollout snapshots).

        If it fails, the trainer's next call raises that failure, named ``name``, as it would a pump failure.
        """
        self._background.append((name, run))

    async def start(self) -> None:
        """Start the rollout pump, and the background tasks, in the background."""
        if self._pump is None:
            self._pump = asyncio.create_task(self._rollout_pump(), name="rollout-pump")
            self._pump.add_done_callback(self._on_pump_done)
            for name, run in self._background:
                task = asyncio.create_task(run(self), name=name)
                task.add_done_callback(lambda done, name=name: self._on_background_done(name, done))
                self._background_tasks.append(task)

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
        await self.buffer_permits.acquire()
        self.ledger.holding_permit.add(sequence)
        try:
            await self.inflight_permits.acquire()
        except BaseException:
            self._release_buffer_permit(sequence)
            raise
        try:
            await self.gate.enter()
        except BaseException:
            self._release_both(sequence)
            raise
        started = asyncio.Event()
        task = group.create_task(self._dispatch_one(entry, started, sequence), name=f"rollout {entry.prompt.prompt_id}")
        task.add_done_callback(lambda t: None if started.is_set() else self._never_started(sequence))
        self._counts["dispatched"] += 1
        await self._notify()

    def _release_buffer_permit(self, sequence: int) -> None:
        self.ledger.holding_permit.discard(sequence)
        self.buffer_permits.release()

    def _release_both(self, sequence: int) -> None:
        self._release_buffer_permit(sequence)
        self.inflight_permits.release()

    def _never_started(self, sequence: int) -> None:
        self._release_both(sequence)
        self.gate.leave()

    async def _dispatch_one(self, entry: PendingGroup, started: asyncio.Event, sequence: int) -> None:
        started.set()
        committed = False
        through_gate = True  # counted by the dispatch gate as generating
        spares = 0  # spares that took a dropped group's place in this slot
        try:
            while True:
                try:
                    # with token capture the manager seals finished generations into entry.sealed (and reuses them)
                    meta = await self.manager.generate_and_push(
                        entry.prompt, target_step=entry.target_step, sealed=entry.sealed
                    )
                    break
                except (RolloutError, GroupFiltered) as failure:
                    if isinstance(failure, GroupFiltered):  # no advantage: consumed, a fresh prompt takes the slot
                        replacement = self._after_filter(failure, entry, sequence)
                    else:  # its retries are spent
                        replacement = await self._after_drop(failure, entry, spares, sequence)
                        spares += 1
                    if replacement is None:
                        return  # dropped, or filtered with no prompt left; its step shrinks
                    entry = replacement
                    self.gate.leave()  # the spare passes the gate afresh: a refit may be draining meanwhile
                    through_gate = False
                    await self.gate.enter()
                    through_gate = True
            committed = True  # the buffer permit now belongs to the group until it is selected or evicted
            self.ledger.commit(sequence, meta.group_id, entry)  # no await since the buffer's commit: one cut
            self._last_progress = time.monotonic()
            self._counts["committed"] += 1
            self.survivorship.add("committed", [meta])
            self.drops.on_commit()
            if spares and meta.target_step is not None:  # spares replace stamped groups only
                self.drops.replaced(meta.target_step)
        except asyncio.CancelledError:
            if self._aborting:  # aborted by a refit (doomed by the sampler): dropped on purpose, not pending
                self.ledger.forget(sequence)
            raise
        finally:
            self.inflight_permits.release()
            if through_gate:
                self.gate.leave()
            if committed:
                self.ledger.holding_permit.discard(sequence)  # the committed group holds it now, not a pending one
            else:
                self._release_buffer_permit(sequence)
            await self._notify()

    async def _after_drop(
        self, failure: RolloutError, entry: PendingGroup, spares: int, sequence: int
    ) -> PendingGroup | None:
        """Drop a group whose retries are spent (or stop the run if its budget is spent); its replacement, if any.

        A spare is taken only for a stamped step not trained yet; if a ready group of a later step exists, it is
        lent to the dropped group's step (which can then close at once) and the spare goes to the lender's step.
        """
        self.drops.allow_drop(failure, classify(failure))  # raises when the drop budget is spent
        log.warning("dropped a prompt group within the drop budget: %s", failure)
        target = entry.target_step
        spare = None if target is None or target < self.trainer_version else self.reserve.take(spares)
        if spare is None:
            self.ledger.forget(sequence)  # dropped on purpose: a checkpoint must not redispatch it
            self.drops.shrink(target, self.trainer_version, entry.prompt.prompt_id)  # raises below the floor
            return None
        assert target is not None
        lent = self.buffer.promote_ready_group(to_target_step=target)
        if lent is not None:
            group_id, lender_step = lent
            self.drops.promoted(target)
            self.ledger.retarget(group_id, target)
            target = lender_step
            await self._notify()  # the borrowing step may be complete now
        replacement = self.recovery.pending(spare, target)
        self.ledger.replace(sequence, replacement)
        return replacement

    def _after_filter(self, filtered: GroupFiltered, entry: PendingGroup, sequence: int) -> PendingGroup | None:
        """Dynamic sampling: the filtered prompt is consumed; a fresh one takes its slot (None: none left, the step
        closes one group short). Raises DynamicSamplingCapExceeded past the step's cap. No await: one cut."""
        assert self.dynamic is not None
        target = entry.target_step
        stale = target is not None and target < self.trainer_version  # its step closed already: nothing waits for it
        step = self.trainer_version if target is None or stale else target
        self.dynamic.filtered(step, filtered, entry.prompt.index)
        if not stale:
            self.dynamic.check_cap(step, filtered)
        prompt = None if stale else refill_prompt(self.reserve, self.prompts)
        if prompt is None:
            self.ledger.forget(sequence)
            if target is not None and not stale:
                self.drops.shortfall[target] += 1
                log.warning("step %d: %s; no prompt left to refill it, the step shrinks", step, filtered)
            return None
        self.dynamic.refilled(step)
        refill = self.recovery.pending(prompt, entry.target_step)
        self.ledger.replace(sequence, refill)
        return refill

    def _on_pump_done(self, task: asyncio.Task) -> None:
        self._on_background_done("rollout pump", task)

    def _on_background_done(self, name: str, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure, self._failed_part = task.exception(), name
        asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``predicate()`` holds, re-checking whenever the controller's state changes."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout_s)

    def raise_if_failed(self) -> None:
        """Raise the rollout pump's (or a background task's) failure, naming the prompt and group that failed."""
        if self._failure is None:
            return
        failure = self._failure
        causes = failure.exceptions if isinstance(failure, BaseExceptionGroup) else (failure,)
        details = "; ".join(str(cause) for cause in causes)
        raise RolloutPumpError(f"{self._failed_part} failed: {details}") from causes[0]

    # ------------------------------------------------------------------------------------------ train side

    async def evict(self, trainer_version: int) -> list[GroupMeta]:
        """Drop groups the sampler can no longer train at ``trainer_version``; their permits are freed."""
        self.raise_if_failed()
        evicted = await self.sampler.evict(trainer_version=trainer_version)
        self._account_removed(evicted, "evicted")
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
                self.raise_if_failed()
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
                    self._account_removed(chosen, "selected")
                    self.manager.goodput.trained(group.group_id for group in chosen)
                    self.ledger.claim(chosen)
                    self._selected_for[trainer_version] += len(chosen)
                    return chosen
                if self._exhausted and not self.manager.inflight:
                    return None
                await self._wait(deadline, trainer_version, min_groups)

    async def _wait(self, deadline: float | None, trainer_version: int, min_groups: int) -> None:
        remaining = None if deadline is None else deadline - time.monotonic()
        try:
            await asyncio.wait_for(self._changed.wait(), remaining)
        except TimeoutError:
            stats = self.stats()
            raise SelectTimeout(
                f"step {trainer_version}: waited past the deadline for {min_groups} trainable group(s); "
                f"{stats.ready} ready, {stats.inflight} in flight, {stats.buffered} buffered"
            ) from None

    def _account_removed(self, groups: Sequence[GroupMeta], counter: str) -> None:
        if groups:
            self.buffer_permits.release(len(groups))
            self._counts[counter] += len(groups)
            self.survivorship.add("trained" if counter == "selected" else "evicted", groups)

    async def begin_refit(self, next_version: int) -> int:
        """The step is trained: close dispatch, abort doomed rollouts, drain the rest (drain gate), release the
        step's claims (delete their rows).

        Returns how many in-flight rollouts were aborted. The drain gate raises DrainTimeout past its deadline. A
        validation of the step still running is settled first (its version is pinned), while rollouts still flow.
        """
        await self._settle_validation()
        self.gate.close()
        aborted = await self._abort_doomed(next_version)
        await self._drain(step=next_version - 1)
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
        self._refit_engine_s.clear()  # a new refit: its buckets share a fresh deadline
        return aborted

    async def _abort_doomed(self, next_version: int) -> int:
        """Cancel the in-flight rollouts the sampler says ``next_version`` can never train; how many."""
        doomed = [
            group.task
            for group in list(self.manager.inflight.values())
            if group.task is not None
            and self.sampler.should_abort_inflight(start_weight=group.start_weight, trainer_version=next_version)
        ]
        self._aborting = True  # their prompts are dropped on purpose: a checkpoint must not redispatch them
        try:
            for task in doomed:
                task.cancel()
            await asyncio.gather(*doomed, return_exceptions=True)
        finally:
            self._aborting = False
        self._counts["aborted"] += len(doomed)
        return len(doomed)

    async def _drain(self, *, step: int) -> None:
        """The drain gate (dispatch closed): wait until no rollout is generating; a no-op when it is off."""
        if self.drain_timeout_s is None:
            return
        try:
            await self.gate.drain(self.drain_timeout_s)
        except TimeoutError:
            stuck = ", ".join(
                f"prompt {group.prompt_id} (group {group_id}, start_weight {group.start_weight})"
                for group_id, group in self.manager.inflight.items()
            )
            raise DrainTimeout(
                f"step {step}: the drain gate (async_rl.in_flight_weight_updates: false) waited past "
                f"async_rl.drain_timeout_s={self.drain_timeout_s} for {self.gate.generating} rollout(s) still "
                f"generating on engine {self.served.engine.name!r}: {stuck or 'none started yet'}"
            ) from None

    async def stand_down_engine(self) -> None:
        """Colocated engine: release the accelerator for the train step (in-flight requests pause).

        Under the drain gate, dispatch closes (until finish_refit) and the rollouts in flight finish first.
        """
        await self._settle_validation()
        if self.drain_timeout_s is not None:
            self.gate.close()
            await self._drain(step=self.trainer_version)
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

        ``last=False``: one bucket of them, more follow (the engine's ``stage_weights``); the last bucket (or the
        whole set) goes through ``update_weights``, when the engine adopts ``version``. One deadline,
        ``refit_timeout_s``, holds for the engine's time on all of a version's buckets together.
        """
        engine, limit = self.served.engine, self.manager.settings.refit_timeout_s
        spent = self._refit_engine_s.get(version, 0.0)
        if not last and not hasattr(engine, "stage_weights"):
            raise EngineError(f"engine {engine.name!r} cannot take weights in buckets (it has no stage_weights)")
        load = engine.update_weights(named_tensors, version) if last else engine.stage_weights(named_tensors, version)
        started = time.monotonic()
        try:
            await asyncio.wait_for(load, max(0.0, limit - spent))
        except TimeoutError:
            raise EngineError(
                f"engine {engine.name!r}: the refit to weight version {version} did not finish within "
                f"policy.generation.refit_timeout_s={limit}"
            ) from None
        finally:
            self._refit_engine_s[version] = spent + time.monotonic() - started

    async def finish_refit(self, version: int) -> None:
        """The engines now hold ``version``: stamp it on new rollouts and reopen dispatch."""
        self.trainer_version = self.served.version = version
        self._last_progress = time.monotonic()  # a step completed
        self._end_warmup_window()
        self.gate.open()
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
        """Write the data plane's rows into ``directory`` and return :meth:`checkpoint_state` — at any moment.

        Behind the checkpoint barrier, so the rows and the replay index describe the same committed groups. The
        state indexes the rows when the sampler ``supports_buffer_checkpoint``; otherwise (shadow mode), or with
        ``directory`` None (no rows saved), the claimed and buffered groups are listed as pending to regenerate.
        Evicted groups' rows may be saved without being indexed; :meth:`restore` drops such orphans.
        """
        async with self.checkpoint_barrier():
            if directory is not None:
                await asyncio.to_thread(self.buffer.data_plane.save, directory)
            return self.checkpoint_state(index_rows=directory is not None and self.sampler.supports_buffer_checkpoint)

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
            buffer_permits_held=self.buffer_permits.held,
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
            **self._counts,
        )

    async def shutdown(self) -> None:
        """Stop the background tasks and the pump (in-flight rollouts are cancelled, slots removed), then the engine."""
        if self.validator is not None:
            self.validator.cancel()
        tasks = [task for task in (*self._background_tasks, self._pump) if task is not None and not task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.served.engine.shutdown()
