"""The Single-Controller strategies: one trainer process, or many ranks on megatron-core's parallelism.

Both hold a :class:`~sc_lightning.rollout_side.side.RolloutSide` (data plane, engine, controller; no Lightning in it)
as :attr:`~SingleControllerHooks.rollout_side`, where callbacks and modules reach it, and drive it from Lightning's
hooks (:class:`SingleControllerHooks`): listen at ``setup_environment``, start it once the module has built its
policy (``setup``; the leader then prints the start banner), stop it at ``teardown`` — also after an exception or
Ctrl-C. The module's train dataloader is the rollout side's ``rl_steps``.

- :class:`SingleControllerStrategy` — one process on one device (Lightning's ``SingleDeviceStrategy``);
- :class:`MultiRankSingleControllerStrategy` — ``trainer.devices`` x ``trainer.num_nodes`` ranks started by
  Lightning's launcher or cluster environments (its own, torchrun, SLURM), on Lightning's ``DDPStrategy``. The
  module is not wrapped in torch's DDP: megatron's parallel state (TP x PP x DP from ``policy.megatron_cfg`` and
  the world size) is set up when the module builds its models, and gradients are summed by megatron-core's DDP
  inside the optimizers (:mod:`~sc_lightning.trainer.data_parallel`).

:func:`single_controller_strategy` picks one for a config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, Strategy

from sc_lightning.checkpoint.bundle import SHARDED_DIR
from sc_lightning.config import SCConfig
from sc_lightning.data_plane.tq_runtime import cpu_cores
from sc_lightning.engines.factory import engine_actor_count
from sc_lightning.lightning.placement import training_device
from sc_lightning.rollout_side.banner import print_banner, run_facts
from sc_lightning.rollout_side.parts import EngineFactory
from sc_lightning.rollout_side.side import RolloutSide
from sc_lightning.trainer.cpu_threads import share_cores_with_engines
from sc_lightning.trainer.data_parallel import parallel_layout
from sc_lightning.trainer.rank_deaths import dead_ranks, lost_peer, training_phase
from sc_lightning.trainer.rank_sync import RankGroup, leader_wait_s
from sc_lightning.trainer.sharded_checkpoint import (
    SHARDED_KEY,
    load_sharded,
    shard_trainer_checkpoint,
    sharded_directory,
    trainer_checkpoint_mismatch,
)

__all__ = ["MultiRankSingleControllerStrategy", "SingleControllerStrategy", "single_controller_strategy"]


class SingleControllerHooks(Strategy):
    """The Lightning hooks both Single-Controller strategies share: they start, feed and stop the rollout side."""

    rollout_side: RolloutSide
    """The Single-Controller's rollout side: callbacks and modules reach the controller, refits and steps here."""

    def setup_environment(self) -> None:
        """Set up the environment as usual (the ranks join), then take the endpoint's port (if one is served); a CPU
        trainer leaves its engines' cores to them (:mod:`~sc_lightning.trainer.cpu_threads`)."""
        super().setup_environment()
        self.rollout_side.listen()
        if self.root_device.type == "cpu":
            engines = engine_actor_count(self.rollout_side.config)
            share_cores_with_engines(cpu_cores(), engines, getattr(self, "num_processes", 1))

    def setup(self, trainer: Trainer) -> None:
        """Set up the model as usual, then start (or, off the leader, attach to) the rollout side; print the banner.

        The whole RL run is one Lightning epoch (dataset epochs are ``max_num_epochs``, counted by the controller):
        see :meth:`_allow_one_more_epoch`.
        """
        super().setup(trainer)
        side = self.rollout_side
        side.start(self.lightning_module, trainer_checkpoint=trainer.ckpt_path)
        if side.leader:
            models = {name: model for name, (model, _) in self.lightning_module.checkpoint_parts([]).items()}
            facts = run_facts(
                models,
                layout="1 rank" if side.ranks is None else parallel_layout(),
                device=self.root_device.type,
                devices=trainer.num_devices,
                nodes=trainer.num_nodes,
                loggers=trainer.loggers,  # not trainer.log_dir: a collective
                endpoint_url=side.endpoint_url,
                spec=getattr(self.lightning_module, "spec", None),
                tokenizer=getattr(self.lightning_module, "tokenizer", None),
            )
            print_banner(side.config, facts)

    def _allow_one_more_epoch(self) -> None:
        """Let the fit loop run exactly one Lightning epoch more than its restored state has finished.

        When rollouts run out, that epoch ends and so does the fit, instead of Lightning opening empty epochs until
        ``max_steps``. A resumed run (with the same or a larger ``max_num_steps``) may restore an epoch that is
        finished, or one that the loop marks finished when it restarts on its last batch. Lightning decides whether
        to run at all after restoring its loops and taking the train dataloader (:meth:`process_dataloader`), and
        marks a restarted last batch's epoch finished just before ``on_train_start``: both call this.
        """
        fit_loop = self.lightning_module.trainer.fit_loop
        fit_loop.max_epochs = fit_loop.epoch_progress.current.processed + 1

    def process_dataloader(self, dataloader: object) -> object:
        """The train dataloader (the rollout side's RL steps): the loops are restored by now, and Lightning has not
        yet decided to run."""
        self._allow_one_more_epoch()
        return super().process_dataloader(dataloader)

    def on_train_start(self) -> None:
        """Allow one more epoch than the (restarted) loop has finished; start the first RL step's clock."""
        super().on_train_start()
        self._allow_one_more_epoch()
        self.rollout_side.start_clock()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """With several ranks, or an optimizer whose state is sliced over data-parallel ranks (megatron's distributed
        optimizer): the models and optimizers go to ``sharded/`` beside ``filepath`` as a distributed checkpoint
        (every rank writes its shards), the rest to ``filepath`` as usual (on the leader)."""
        optimizers = self.lightning_module.trainer.optimizers
        if self.rollout_side.ranks is not None or any(getattr(o, "distributed", False) for o in optimizers):
            shard_trainer_checkpoint(checkpoint, Path(filepath).parent / SHARDED_DIR, self._checkpoint_parts)
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        """Load the models: from the bundle's distributed checkpoint, resharded to this layout, if it has one (a
        CheckpointMismatch when the trainer checkpoint's models have other names or shapes than this run's)."""
        ckpt_path = self.lightning_module.trainer.ckpt_path
        directory = sharded_directory(checkpoint, ckpt_path)
        if directory is not None:
            load_sharded(directory, self._checkpoint_parts(False))
            return
        try:
            super().load_model_state_dict(checkpoint, strict=strict)
        except RuntimeError as err:  # torch's "Error(s) in loading state_dict": missing, unexpected, size
            raise trainer_checkpoint_mismatch(ckpt_path, "models", err) from err

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        """Load the optimizers: from the bundle's distributed checkpoint (resharded), if it has one (a
        CheckpointMismatch when the trainer checkpoint's optimizer state has other parameter groups than this run's)."""
        ckpt_path = self.lightning_module.trainer.ckpt_path
        directory = sharded_directory(checkpoint, ckpt_path)
        if directory is None:
            try:
                super().load_optimizer_state_dict(checkpoint)
            except ValueError as err:  # torch's "loaded state dict ... parameter group(s)"
                raise trainer_checkpoint_mismatch(ckpt_path, "optimizers", err) from err
        elif checkpoint[SHARDED_KEY]["optimizers"]:
            load_sharded(directory, self._checkpoint_parts(True))

    def _checkpoint_parts(self, optimizers: bool) -> dict[str, Any]:
        """The module's models (and, with ``optimizers``, the optimizer of each trained one) by name."""
        trainer_optimizers = self.lightning_module.trainer.optimizers if optimizers else []
        return self.lightning_module.checkpoint_parts(trainer_optimizers)

    def teardown(self) -> None:
        """Stop the rollout side (controller, engine, data plane), then the usual strategy teardown."""
        try:
            self.rollout_side.shutdown()
        finally:
            super().teardown()


class SingleControllerStrategy(SingleControllerHooks, SingleDeviceStrategy):
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
        self.rollout_side = RolloutSide(config, engine_factory, resume_state=resume_state)

    def setup_environment(self) -> None:
        """Take the accelerator's device (unless one was given), then let the accelerator set it up."""
        if self._follows_accelerator:
            self._root_device = training_device(self.accelerator)
        super().setup_environment()


class MultiRankSingleControllerStrategy(SingleControllerHooks, DDPStrategy):
    """Lightning's DDP strategy over megatron-core's parallelism, with the rollout side on global rank 0."""

    def __init__(
        self, config: SCConfig, engine_factory: EngineFactory, *, resume_state: Path | None = None, **ddp: Any
    ) -> None:
        """``resume_state`` as for :class:`SingleControllerStrategy`; ``ddp`` goes to Lightning's ``DDPStrategy``
        (cluster environment, process-group timeout, …)."""
        super().__init__(**ddp)
        self.rollout_side = RolloutSide(config, engine_factory, resume_state=resume_state)

    def setup_distributed(self) -> None:
        """Join the ranks (Lightning's process group), then open the metadata channel the leader broadcasts on."""
        super().setup_distributed()
        self.rollout_side.ranks = RankGroup(timeout_s=leader_wait_s(self.rollout_side.config))

    def configure_ddp(self) -> None:
        """No torch DDP wrapper: megatron-core's DDP inside the optimizers sums the gradients."""

    def on_exception(self, exception: BaseException) -> None:
        """Name the trainer ranks whose process died in the error (a dead rank shows up on the others as a broken
        connection): children of this node's Lightning launcher by their exit, else, with several nodes, the other
        nodes whose rank this one may have lost. torchrun and SLURM report their ranks themselves."""
        super().on_exception(exception)
        if died := dead_ranks(self.launcher, node_rank=self.node_rank, ranks_per_node=self.num_processes):
            died = f"{died}; rank {self.global_rank} noticed it {training_phase(self.lightning_module)}"
        else:
            died = lost_peer(exception, node_rank=self.node_rank, num_nodes=self.num_nodes)
        if died:
            exception.args = (f"{exception.args[0] if exception.args else exception!r}\n{died}", *exception.args[1:])


def single_controller_strategy(
    config: SCConfig, engine_factory: EngineFactory, *, ranks: int, resume_state: Path | None = None
) -> SingleControllerStrategy | MultiRankSingleControllerStrategy:
    """The strategy for ``ranks`` trainer processes (``trainer.devices`` x ``trainer.num_nodes``)."""
    if ranks == 1:
        return SingleControllerStrategy(config, engine_factory, resume_state=resume_state)
    return MultiRankSingleControllerStrategy(config, engine_factory, resume_state=resume_state)
