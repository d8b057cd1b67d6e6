"""The Single-Controller strategies: one trainer process, or many ranks on megatron-core's parallelism.

Both run the rollout side of :class:`~sc_lightning.lightning.controller_host.ControllerHost` (data plane, engine,
controller, started on the leader at ``setup`` and stopped at ``teardown``) beside Lightning's own strategy:

- :class:`SingleControllerStrategy` — one process on one device (Lightning's ``SingleDeviceStrategy``);
- :class:`MultiRankSingleControllerStrategy` — ``trainer.devices`` x ``trainer.num_nodes`` ranks started by
  Lightning's launcher or cluster environments (its own, torchrun, SLURM), on Lightning's ``DDPStrategy``. The
  module is not wrapped in torch's DDP: megatron's parallel state (TP x PP x DP from ``policy.megatron_cfg`` and
  the world size) is set up when the module builds its models, and gradients are summed by megatron-core's DDP
  inside the optimizers (:mod:`~sc_lightning.trainer.data_parallel`).

:func:`single_controller_strategy` picks one for a config.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from sc_lightning.config import SCConfig
from sc_lightning.lightning.controller_host import ControllerHost, EngineFactory
from sc_lightning.lightning.placement import training_device
from sc_lightning.trainer.rank_sync import RankGroup

__all__ = ["MultiRankSingleControllerStrategy", "SingleControllerStrategy", "single_controller_strategy"]


class SingleControllerStrategy(ControllerHost, SingleDeviceStrategy):
    """A single-device Lightning strategy that also runs the Single-Controller's rollout side."""

    def __init__(
        self,
        config: SCConfig,
        engine_factory: EngineFactory,
        *,
        device: str | torch.device | None = None,
        resume_state: Path | None = None,
    ) -> None:
        """``device``: where the models live; None follows the Trainer's accelerator (see :mod:`.placement`).
        ``resume_state``: the bundle or rollout snapshot whose controller state and rows a resume loads (None:
        the bundle of ``trainer.fit(ckpt_path=...)``, if that is one; a bootstrap snapshot has no ckpt_path)."""
        super().__init__(device=torch.device("cpu" if device is None else device))
        self._follows_accelerator = device is None
        self._init_controller_host(config, engine_factory, resume_state)

    def setup_environment(self) -> None:
        """Take the accelerator's device (unless one was given), then let the accelerator set it up."""
        if self._follows_accelerator:
            self._root_device = training_device(self.accelerator)
        super().setup_environment()


class MultiRankSingleControllerStrategy(ControllerHost, DDPStrategy):
    """Lightning's DDP strategy over megatron-core's parallelism, with the rollout side on global rank 0."""

    def __init__(
        self, config: SCConfig, engine_factory: EngineFactory, *, resume_state: Path | None = None, **ddp: Any
    ) -> None:
        """``resume_state`` as for :class:`SingleControllerStrategy`; ``ddp`` goes to Lightning's ``DDPStrategy``
        (cluster environment, process-group timeout, …)."""
        super().__init__(**ddp)
        self._init_controller_host(config, engine_factory, resume_state)

    def setup_distributed(self) -> None:
        """Join the ranks (Lightning's process group), then open the metadata channel the leader broadcasts on."""
        super().setup_distributed()
        self.ranks = RankGroup(timeout_s=self.config.async_rl.stall_watchdog.stall_timeout_s + 60.0)

    def configure_ddp(self) -> None:
        """No torch DDP wrapper: megatron-core's DDP inside the optimizers sums the gradients."""

    def on_exception(self, exception: BaseException) -> None:
        """Name the trainer ranks whose process died in the error (a dead rank shows up on the others as a broken
        connection). Children of Lightning's own launcher only: torchrun and SLURM report their ranks themselves."""
        super().on_exception(exception)
        if died := dead_ranks(self.launcher, node_rank=self.node_rank, ranks_per_node=self.num_processes):
            exception.args = (f"{exception.args[0] if exception.args else exception!r}\n{died}", *exception.args[1:])


def dead_ranks(launcher: Any, *, node_rank: int, ranks_per_node: int, grace_s: float = 2.0) -> str:
    """A sentence naming the ranks this node's launcher started whose process has ended with an error ('' if none).

    A rank that died just now may not have been reaped yet: it waits up to ``grace_s`` for one to show.
    """
    children = getattr(launcher, "procs", None) or []
    deadline = time.monotonic() + grace_s
    while True:
        failed = [(i + 1, child) for i, child in enumerate(children) if child.poll() not in (None, 0)]
        if failed or time.monotonic() >= deadline or not children:
            break
        time.sleep(0.05)
    return "; ".join(
        f"trainer rank {node_rank * ranks_per_node + local} (pid {child.pid}) died: {_exit_reason(child.returncode)}"
        for local, child in failed
    )


def _exit_reason(returncode: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


def single_controller_strategy(
    config: SCConfig, engine_factory: EngineFactory, *, ranks: int, resume_state: Path | None = None
) -> SingleControllerStrategy | MultiRankSingleControllerStrategy:
    """The strategy for ``ranks`` trainer processes (``trainer.devices`` x ``trainer.num_nodes``)."""
    if ranks == 1:
        return SingleControllerStrategy(config, engine_factory, resume_state=resume_state)
    return MultiRankSingleControllerStrategy(config, engine_factory, resume_state=resume_state)
