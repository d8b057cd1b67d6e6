"""FitStop: a stop signal ends the fit after the step in progress, and the fit's end says why it stopped.

Why a fit stops, in the order it is told (one line on stderr, from the leader, once the rollout side has stopped)::

    fit stopped after step 32: trainer.max_time (00:00:00:15) reached; its bundle is results/ckpt/step_32: run the
    same command to go on

- a stop signal: SIGTERM, SIGUSR1 (SLURM's warning before a preemption, ``--signal``) or SIGINT (Ctrl-C), received
  while training; the command exits with 128 + the signal's number (143, 138, 130). A wait for rollouts ends at once
  (an environment that stopped answering holds nothing up): between steps the fit then ends after its last finished
  step, whose bundle is written; inside a step (a streamed step waiting for a later chunk) it ends without a bundle
  of that step, the newest bundle standing. A step that is computing, refitting or writing finishes first. A second
  SIGINT stops at once, without a bundle of that step (the run then resumes from its previous bundle). Several
  trainer ranks stop together: a signal on the leader ends every rank's wait, and one on any rank counts for all
  after the step, and every rank exits with its code (:func:`quiet_child_process_observer` keeps Lightning's launcher
  from taking the other ranks' exit for a crash);
- ``<algo>.max_num_steps`` reached;
- ``trainer.max_time`` reached. It limits each ``fit`` command, not the run's total: the time a resumed run spent
  before is not carried over (Lightning's timer state is dropped from the bundle it resumes from), so a job under a
  wall-clock limit goes on each time it is run again;
- ``trainer.limit_train_batches`` reached (a Trainer built in Python only: the CLI refuses the knob, as the whole RL
  run is one Lightning epoch whose batch count goes on across resumes);
- ``trainer.should_stop`` set by a callback (e.g. Lightning's ``EarlyStopping``);
- the rollouts ran out: the dataset's prompts, ``<algo>.max_num_epochs`` times over, are all trained or dropped.

Lightning's own stop line (```Trainer.fit` stopped: `max_epochs=1` reached.``: the whole run is one Lightning epoch)
is dropped by :func:`~sc_lightning.console.quiet_libraries`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Timer

from sc_lightning.checkpoint.bundle import bundle_name
from sc_lightning.config import SCConfig
from sc_lightning.controller.api import WaitInterrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class FitStop(Callback):
    """Turns SIGINT / SIGTERM / SIGUSR1 into a stop after the step in progress (a wait for rollouts ends at once);
    prints why the fit stopped."""

    def __init__(self, config: SCConfig) -> None:
        self.config = config
        self.signal: signal.Signals | None = None  # the first stop signal received while training
        self.reason: str | None = None  # why the fit stopped, once it has
        self._previous: dict[signal.Signals, Any] = {}
        self._rollout_side: Any = None  # the strategy's, whose waits for rollouts a stop signal ends

    @property
    def exit_code(self) -> int:
        """The command's exit code: 128 + the stop signal's number, or 0."""
        return 128 + self.signal if self.signal is not None else 0

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Leave Lightning's timer state out of the bundle: ``trainer.max_time`` counts one command's time only."""
        _drop_timer_state(checkpoint)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Drop the timer state a bundle written without FitStop holds (see :meth:`on_save_checkpoint`)."""
        _drop_timer_state(checkpoint)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Take the stop signals over while training (main thread only: elsewhere Python cannot)."""
        self._rollout_side = getattr(trainer.strategy, "rollout_side", None)
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._on_signal) for signum in STOP_SIGNALS}

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After a step: stop the fit when a signal reached any rank (a collective: every rank decides alike)."""
        mine = torch.tensor(self.signal or 0, device=trainer.strategy.root_device)
        received = int(trainer.strategy.reduce(mine, reduce_op="max"))
        if received:
            self.signal = signal.Signals(received)
            trainer.should_stop = True
            quiet_child_process_observer()  # every rank now exits with the signal's code: not a crash

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Work out why the fit stopped (the signals stay taken while the last bundle is written)."""
        self.reason = self._why(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Give the signals back; a stop signal that ended a step's wait for rollouts says so (no bundle of it)."""
        self._restore_signals()
        if isinstance(exception, WaitInterrupted) and self.signal is not None and trainer.is_global_zero:
            self.reason = f"{self.signal.name} received"
            line = self._line(trainer.global_step).replace("after step", "during step", 1)
            print(f"{line} (it waited for rollouts: that step has no bundle)", file=sys.stderr, flush=True)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Say why the fit stopped and where its last bundle is (the leader; after the rollout side stopped)."""
        if trainer.is_global_zero and self.reason is not None:
            print(self._line(trainer.global_step), file=sys.stderr, flush=True)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Give the signals back."""
        self._restore_signals()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signal == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        if self.signal is None:
            self.signal = signal.Signals(signum)
            again = "; Ctrl-C again to stop now, without it" if signum == signal.SIGINT else ""
            message = f"\n{self.signal.name} received: stopping after the step in progress{again}\n"
            os.write(2, message.encode())  # not print: a signal handler may interrupt a print to the same stream
            if self._rollout_side is not None:
                self._rollout_side.interrupt_waits()  # returns at once; the trainer's wait then ends

    def _restore_signals(self) -> None:
        """Give back the handlers taken over, unless Lightning's teardown has put its originals back already."""
        for signum, handler in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, handler)
        self._previous = {}

    def _why(self, trainer: Trainer) -> str:
        """Why the fit stopped (see the module docstring for the order)."""
        algo = self.config.algo_name
        if self.signal is not None:
            return f"{self.signal.name} received"
        if trainer.global_step >= self.config.algo.max_num_steps:
            return f"{algo}.max_num_steps ({self.config.algo.max_num_steps}) reached"
        for timer in (c for c in trainer.callbacks if isinstance(c, Timer)):
            remaining = timer.time_remaining()
            if remaining is not None and remaining <= 0:
                return f"trainer.max_time ({_max_time(timer)}) reached"
        epoch_loop = trainer.fit_loop.epoch_loop
        limited = trainer.num_training_batches < self.config.algo.max_num_steps
        if limited and epoch_loop.batch_progress.current.ready >= trainer.num_training_batches:
            return f"trainer.limit_train_batches ({trainer.limit_train_batches}) reached"
        if trainer.should_stop:
            return "trainer.should_stop was set by a callback"
        return f"the rollouts ran out ({algo}.max_num_epochs {self.config.algo.max_num_epochs} of the dataset)"

    def _line(self, step: int) -> str:
        """The stop line: the reason, and the bundle the same command resumes from."""
        line = f"fit stopped after step {step}: {self.reason}"
        checkpointing = self.config.checkpointing
        if not checkpointing.enabled:
            return f"{line} (checkpointing is off: nothing to resume from)"
        bundle = Path(checkpointing.checkpoint_dir) / bundle_name(step)
        if not bundle.is_dir():
            return line
        if step >= self.config.algo.max_num_steps:
            return f"{line}; its bundle is {bundle}"
        return f"{line}; its bundle is {bundle}: run the same command to go on"


CHILD_PROCESS_OBSERVER = "child-process-observer"
"""The name of the thread through which Lightning's subprocess launcher watches the ranks it started."""


def quiet_child_process_observer() -> None:
    """Keep Lightning's child-process observer from killing this process when the ranks it started exit non-zero.

    With ``trainer.devices`` > 1 from one command, Lightning's subprocess launcher watches the other ranks from a
    thread of the leader that SIGKILLs every rank, the leader included, once it sees one that exited non-zero (it looks
    every 5 s). After a coordinated stop every rank exits with 128 + the signal's number, so a rank that exits first
    would have the leader killed (exit -9) while it still writes its bundle and stops the rollout side. Lightning has no
    switch for it: the thread's check is replaced by one that ends it at its next look. A no-op in any other process.
    """
    for thread in threading.enumerate():
        if thread.name == CHILD_PROCESS_OBSERVER and hasattr(thread, "_run"):
            thread._run = lambda: True  # its loop stops when the check returns True


def _drop_timer_state(checkpoint: dict[str, Any]) -> None:
    """Remove Lightning's Timer callback state (keyed by its class name) from a checkpoint."""
    states = checkpoint.get("callbacks") or {}
    for key in [key for key in states if str(key).split("{", 1)[0] == Timer.__qualname__]:
        del states[key]


def _max_time(timer: Timer) -> str:
    """A timer's limit as ``trainer.max_time`` spells it (DD:HH:MM:SS)."""
    seconds = round(timer.time_elapsed() + (timer.time_remaining() or 0.0))
    return f"{seconds // 86400:02d}:{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
