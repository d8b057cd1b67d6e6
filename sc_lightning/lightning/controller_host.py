"""ControllerHost: the Single-Controller's side of a Lightning strategy, for one trainer process or many.

At ``setup`` (after the module built its policy) the leader rank — the only rank of a one-process run, global rank 0
of many — loads the prompt dataset (a bad one fails here, before anything starts), then starts, in order: the data
plane, the generation engine (seeded with the policy's current weights), and the controller with its rollout pump
(on a background thread). With ``expose_http_server`` on (``vllm_cfg`` or ``mcore_generation_config``, by backend)
it also serves the engine as an OpenAI-compatible endpoint on loopback (:attr:`endpoint_url`, on the backend's
``http_port``, which the leader binds first thing, in ``setup_environment``: a port in use fails before anything
starts, as an EndpointPortError naming the knob); with ``env.name: external`` that endpoint also hands the rollouts
to external agents (:mod:`~sc_lightning.rollout.external`). Then the leader prints the start banner
(:mod:`~sc_lightning.lightning.banner`). The other ranks start nothing: they receive a handle on the data plane and,
for every selection, the leader's group metadata (:mod:`~sc_lightning.trainer.rank_sync`), and read their own rows by
key. At ``teardown`` — also after an exception
or Ctrl-C — the leader stops what it started, in reverse order. The module's train dataloader is :meth:`rl_steps`,
one item per RL step.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sc_lightning.checkpoint.bundle import CONTROLLER_FILE, DATA_PLANE_DIR, SHARDED_DIR, read_controller_state
from sc_lightning.checkpoint.periodic import RolloutSnapshotter
from sc_lightning.checkpoint.snapshots import config_identity
from sc_lightning.config import SCConfig
from sc_lightning.controller.api import RefitReport
from sc_lightning.controller.build import (
    BeforeStart,
    LocalController,
    build_controller,
    resume_restorer,
    rollout_settings,
)
from sc_lightning.data_plane import build_data_plane
from sc_lightning.data_plane.base import DataPlane
from sc_lightning.engines.base import GenerationEngine
from sc_lightning.engines.factory import context_tokens
from sc_lightning.lightning.banner import print_banner, run_facts
from sc_lightning.rollout.datasets import build_dataset
from sc_lightning.rollout.envs import answer_check, build_environment
from sc_lightning.rollout.external import ExternalRollouts
from sc_lightning.rollout.prompts import check_dataset_fits_steps
from sc_lightning.rollout.serving.listen import listen_on_loopback
from sc_lightning.rollout.serving.server import OpenAIEndpoint
from sc_lightning.trainer.data_parallel import data_parallel_representative, parallel_layout
from sc_lightning.trainer.rank_sync import FollowerSelect, LeaderSelect, RankGroup
from sc_lightning.trainer.refit_gather import policy_buckets
from sc_lightning.trainer.sharded_checkpoint import CheckpointMismatch, load_sharded, save_sharded
from sc_lightning.trainer.step_stream import GroupSource, RLStepStream, StepSettings

EngineFactory = Callable[[SCConfig, list[tuple[str, torch.Tensor]]], GenerationEngine]
"""Builds the generation engine from the config and the policy's initial (HF-named) weights."""
SHARDED_KEY = "sc_lightning_sharded"
"""The trainer checkpoint's entry saying its models and optimizers are in a distributed checkpoint beside it."""


@dataclass(frozen=True)
class RefitRecord:
    """The last refit: the version it published, the controller's report, how long it took, when it ended, and
    the RL step's wall time (from the previous refit's end, or the fit's start, to this one's end)."""

    version: int
    report: RefitReport
    duration_s: float
    finished_at: float  # time.monotonic()
    step_s: float


def http_server_port(config: SCConfig) -> int | None:
    """The port of the OpenAI-compatible endpoint (0: a free one), or None when the config serves none (the knobs
    of the chosen backend)."""
    generation = config.policy.generation
    settings = generation.vllm_cfg if generation.backend == "vllm" else generation.mcore_generation_config
    return settings.http_port if settings.expose_http_server else None


def http_port_knob(config: SCConfig) -> str:
    """The dotpath of the endpoint's port knob of the chosen backend."""
    block = "vllm_cfg" if config.policy.generation.backend == "vllm" else "mcore_generation_config"
    return f"policy.generation.{block}.http_port"


def external_rollouts(config: SCConfig, engine: GenerationEngine) -> ExternalRollouts | None:
    """The external agents' rollout registry when ``env.name`` is ``external`` (served by the endpoint), else None."""
    if config.env.name != "external":
        return None
    return ExternalRollouts(max_total_tokens=config.policy.max_total_sequence_length, engine_name=engine.name)


def rollout_snapshotter(config: SCConfig) -> RolloutSnapshotter | None:
    """The periodic rollout snapshotter ``rollout_checkpointing`` asks for, or None."""
    settings = config.rollout_checkpointing
    if settings.snapshot_attempt_interval_s is None:
        return None
    return RolloutSnapshotter(
        checkpoint_dir=Path(config.checkpointing.checkpoint_dir),
        interval_s=settings.snapshot_attempt_interval_s,
        keep_latest_k=settings.keep_latest_k,
        max_consecutive_failures=settings.max_consecutive_failures,
        identity=config_identity(config),
    )


class ControllerHost:
    """The rollout side of a Lightning strategy (a mixin before the strategy's Lightning base)."""

    lightning_module: Any  # provided by the Lightning strategy this is mixed into

    def _init_controller_host(self, config: SCConfig, engine_factory: EngineFactory, resume_state: Path | None) -> None:
        self.config = config
        self.refit_bucket_bytes = int(config.policy.generation.refit_bucket_mb * 2**20)  # held at most in a refit
        self.engine_factory = engine_factory
        self.resume_state = resume_state
        self.data_plane: DataPlane | None = None
        self._engine_accepts_megatron_weights = False  # set when the engine is built (see refit)
        self.controller: LocalController | None = None
        self.last_refit: RefitRecord | None = None
        self._step_clock = time.monotonic()  # the current RL step's start: the fit's, then each refit's end
        self.endpoint: OpenAIEndpoint | None = None
        self.endpoint_url: str | None = None
        self._endpoint_socket: socket.socket | None = None  # bound in setup_environment, served by the endpoint
        self.ranks: RankGroup | None = None  # with several trainer ranks: their metadata channel

    @property
    def leader(self) -> bool:
        """Whether this rank owns the controller, the data plane and the engine (always, in one process)."""
        return self.ranks is None or self.ranks.leader

    def setup_environment(self) -> None:
        """Set up the environment as usual (the ranks join), then, on the leader serving the endpoint, listen on its
        port: taken, it fails here (EndpointPortError naming the knob), before any model, engine or Ray starts."""
        super().setup_environment()  # type: ignore[misc]
        port = http_server_port(self.config)
        if port is not None and self.leader and self._endpoint_socket is None:
            self._endpoint_socket = listen_on_loopback(port, http_port_knob(self.config))

    def setup(self, trainer: Any) -> None:
        """Set up the model as usual, then start (or, off the leader, attach to) the rollout side.

        The whole RL run is one Lightning epoch (dataset epochs are ``max_num_epochs``, counted by the controller):
        see :meth:`_allow_one_more_epoch`.
        """
        super().setup(trainer)  # type: ignore[misc]
        self._start()

    def _allow_one_more_epoch(self) -> None:
        """Let the fit loop run exactly one Lightning epoch more than its restored state has finished.

        When rollouts run out, that epoch ends and so does the fit, instead of Lightning opening empty epochs until
        ``max_steps``. A resumed run (with the same or a larger ``max_num_steps``) may restore an epoch that is
        finished, or one that the loop marks finished when it restarts on its last batch. Lightning decides whether
        to run at all after restoring its loops and asking for the train dataloader (:meth:`rl_steps`), and marks a
        restarted last batch's epoch finished just before ``on_train_start``: both call this.
        """
        fit_loop = self.lightning_module.trainer.fit_loop
        fit_loop.max_epochs = fit_loop.epoch_progress.current.processed + 1

    def on_train_start(self) -> None:
        """Allow one more epoch than the (restarted) loop has finished; start the first RL step's clock."""
        super().on_train_start()  # type: ignore[misc]
        self._allow_one_more_epoch()
        self._step_clock = time.monotonic()

    @property
    def colocated(self) -> bool:
        """Whether the engine shares the trainer's accelerator (``policy.generation.colocated.enabled``)."""
        return self.config.policy.generation.colocated.enabled

    def policy_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The module's whole policy under HF names, on the leader (the other ranks get an empty list): what the
        engine is built from at start. A collective over the ranks, like :meth:`policy_buckets`, whose buckets it
        joins."""
        return [pair for bucket, _ in self.policy_buckets() for pair in bucket]

    def policy_buckets(self) -> Iterator[tuple[list[tuple[str, torch.Tensor]], bool]]:
        """The module's policy under HF names as ``(bucket, last)`` on the leader, each bucket at most
        :attr:`refit_bucket_bytes` (or one module's tensors), gathered only when asked for; nothing on the other
        ranks. A collective: every rank must exhaust it (:mod:`~sc_lightning.trainer.refit_gather`: the first
        data-parallel replica exports, tensor-parallel shards are gathered, later pipeline stages send theirs)."""
        module = self.lightning_module
        return policy_buckets(module.policy, module.spec, self.ranks, bound=self.refit_bucket_bytes)

    def refit(self, version: int, *, wake: bool = False) -> RefitReport | None:
        """After the optimizer step that made ``version``: release the step, push the policy, reopen dispatch.

        The weights are pushed only when the module's ``policy_trained`` says the step changed the policy (a PPO
        critic warm-up does not); ``wake`` wakes a colocated engine before dispatch reopens. The controller calls
        are the leader's (the other ranks only help gather the weights, and get None); :attr:`last_refit` records
        the refit. An in-process Megatron engine takes the live megatron-named parameters in one call (it copies
        them before the call returns); any other engine gets the HF-named policy bucket by bucket
        (:meth:`_streamed_refit`).
        """
        started = time.monotonic()
        trained = self.lightning_module.policy_trained
        if not self.leader:
            for _ in self.policy_buckets() if trained else ():  # this rank's share of the gathers and sends
                pass
            return None
        controller = self._running_controller()
        if trained and not self._engine_accepts_megatron_weights:
            report = self._streamed_refit(controller, version, wake=wake)
        else:
            from sc_lightning.models.megatron import megatron_weights

            weights = megatron_weights(self.lightning_module.policy) if trained else None
            report = controller.refit(version, weights, wake=wake)
        finished = time.monotonic()
        self.last_refit = RefitRecord(version, report, finished - started, finished, finished - self._step_clock)
        self._step_clock = finished
        return report

    def _streamed_refit(self, controller: LocalController, version: int, *, wake: bool) -> RefitReport:
        """begin_refit, then each bucket pushed as soon as it is gathered (and dropped before the next is), then
        wake and finish_refit: the engines adopt ``version`` with its last bucket, and rollouts are stamped with it
        once dispatch reopens. The first bucket is gathered while dispatch is still open."""
        buckets = self.policy_buckets()
        pending = next(buckets, None)
        aborted = controller.begin_refit(version)
        while pending is not None:
            bucket, last = pending
            pending = None
            controller.push_weights(bucket, version, last=last)
            del bucket  # gone before the next bucket is gathered
            pending = next(buckets, None)
        if wake:
            controller.wake_engine()
        controller.finish_refit(version)
        return RefitReport(aborted, controller.stats())

    def stand_down_engine(self) -> None:
        """Colocated: the engine releases the accelerator for the train step (its requests and deadlines freeze)."""
        if self.leader:
            self._running_controller().stand_down_engine()

    def trained_rows_on_leader(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every data-parallel replica's trained rows of a step, on the leader (a collective over the ranks; the
        other ranks get an empty list). Tensor- and pipeline-parallel peers trained the same rows: one sends them."""
        if self.ranks is None:
            return rows
        gathered = self.ranks.gather(rows if data_parallel_representative() else [])
        return [row for rank_rows in gathered or [] for row in rank_rows]

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """With several ranks, or an optimizer whose state is sliced over data-parallel ranks (megatron's distributed
        optimizer): the models and optimizers go to ``sharded/`` beside ``filepath`` as a distributed checkpoint
        (every rank writes its shards), the rest to ``filepath`` as usual (on the leader)."""
        if self.ranks is not None or self._optimizer_state_is_sliced():
            with_optimizers = "optimizer_states" in checkpoint
            save_sharded(Path(filepath).parent / SHARDED_DIR, self._checkpoint_parts(optimizers=with_optimizers))
            checkpoint["state_dict"] = {}  # Lightning checks the keys exist; the strategy's loaders read sharded/
            if with_optimizers:
                checkpoint["optimizer_states"] = []
            checkpoint[SHARDED_KEY] = {"directory": SHARDED_DIR, "optimizers": with_optimizers}
        super().save_checkpoint(checkpoint, filepath, storage_options)  # type: ignore[misc]

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        """Load the models: from the bundle's distributed checkpoint, resharded to this layout, if it has one (a
        CheckpointMismatch when the trainer checkpoint's models have other names or shapes than this run's)."""
        if SHARDED_KEY not in checkpoint:
            try:
                super().load_model_state_dict(checkpoint, strict=strict)  # type: ignore[misc]
            except RuntimeError as err:  # torch's "Error(s) in loading state_dict": missing, unexpected, size
                raise self._mismatch("models", err) from err
            return
        load_sharded(self._sharded_directory(checkpoint), self._checkpoint_parts(optimizers=False))

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        """Load the optimizers: from the bundle's distributed checkpoint (resharded), if it has one (a
        CheckpointMismatch when the trainer checkpoint's optimizer state has other parameter groups than this run's)."""
        if SHARDED_KEY not in checkpoint:
            try:
                super().load_optimizer_state_dict(checkpoint)  # type: ignore[misc]
            except ValueError as err:  # torch's "loaded state dict ... parameter group(s)"
                raise self._mismatch("optimizers", err) from err
        elif checkpoint[SHARDED_KEY]["optimizers"]:
            load_sharded(self._sharded_directory(checkpoint), self._checkpoint_parts(optimizers=True))

    def _mismatch(self, what: str, err: Exception) -> CheckpointMismatch:
        """The error for a trainer checkpoint whose ``what`` do not fit this run's, with torch's reasons (3 at most)."""
        details = [line.strip()[:160] for line in str(err).splitlines()[1:] if line.strip()]  # torch: one per kind
        reason = "; ".join(details[:3]) or str(err)
        return CheckpointMismatch(
            f"{self.lightning_module.trainer.ckpt_path}: its {what} do not fit this run's ({reason}): resume with the "
            "model and optimizer settings of the run that wrote it (policy.model_name, policy.megatron_cfg, "
            "value.*), or start afresh with a new checkpointing.checkpoint_dir (nothing was deleted)"
        )

    def _optimizer_state_is_sliced(self) -> bool:
        """Whether a trained model's optimizer is megatron's distributed optimizer (its ``state_dict`` holds no
        weights or moments)."""
        return any(getattr(optimizer, "distributed", False) for optimizer in self.lightning_module.trainer.optimizers)

    def _sharded_directory(self, checkpoint: dict[str, Any]) -> Path:
        """The distributed checkpoint beside the trainer checkpoint being restored."""
        return Path(self.lightning_module.trainer.ckpt_path).parent / checkpoint[SHARDED_KEY]["directory"]

    def _checkpoint_parts(self, *, optimizers: bool) -> dict[str, Any]:
        """The module's models (and, with ``optimizers``, the optimizer of each trained one) by name."""
        trainer_optimizers = self.lightning_module.trainer.optimizers if optimizers else []
        return self.lightning_module.checkpoint_parts(trainer_optimizers)

    def _running_controller(self) -> LocalController:
        """The started controller; RuntimeError before ``setup``, after ``teardown`` or off the leader."""
        if self.controller is None:
            raise RuntimeError("the Single-Controller strategy has not been set up (or this rank is not the leader)")
        return self.controller

    def _start(self) -> None:
        weights = self.policy_weights()  # every rank of the first replica takes part in gathering TP shards
        if self.leader:
            self._start_rollout_side(weights)
            layout = "1 rank" if self.ranks is None else parallel_layout()
            print_banner(self.config, run_facts(self, layout, self.endpoint_url))
        if self.ranks is not None:
            self.data_plane = self.ranks.broadcast(self.data_plane)  # a handle: the others attach by key

    def _start_rollout_side(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        module = self.lightning_module
        config, tokenizer = self.config, module.tokenizer
        environment = build_environment(config.env)  # its answer check runs on every dataset row
        dataset = build_dataset(config.data, tokenizer, seed=config.algo.seed, check_answer=answer_check(environment))
        check_dataset_fits_steps(config, len(dataset))  # bad rows and a too-small dataset fail before anything starts
        self.data_plane = build_data_plane(config.data_plane)
        data_plane = self.data_plane
        engine = self.engine_factory(config, weights)  # here, on the main thread (it may start Ray)
        self._engine_accepts_megatron_weights = bool(getattr(engine, "accepts_megatron_weights", False))

        snapshotter = rollout_snapshotter(config)
        external = external_rollouts(config, engine)

        def build() -> Any:
            """Runs on the controller thread: the controller and its parts."""
            controller = build_controller(
                config,
                data_plane=data_plane,
                engine=engine,
                environment=environment,
                tokenizer=tokenizer,
                dataset=dataset,
            )
            if snapshotter is not None:
                controller.add_background_task("rollout snapshots", snapshotter.run)
            if external is not None:
                controller.manager.sample_source = external  # each sample: an agent's rollout, scored by the agent
            return controller

        self.controller = LocalController(build, before_start=self._restorer(weights))
        port = http_server_port(config)
        if port is not None:
            self.endpoint = OpenAIEndpoint(
                engine,
                tokenizer,
                model_name=config.policy.model_name,
                defaults=rollout_settings(config).sampling,
                context_tokens=context_tokens(config),
                port=port,
                sock=self._endpoint_socket,
                rollouts=external,
            )
            self.endpoint_url = self.controller.call(self.endpoint.start())  # on the loop that owns the engine

    def resume_bundle(self) -> Path | None:
        """The bundle or snapshot a resume loads (``resume_state``, else the bundle of ``trainer.fit``'s ckpt_path)."""
        if self.resume_state is not None:
            return self.resume_state
        ckpt_path = self.lightning_module.trainer.ckpt_path
        if ckpt_path is None:
            return None
        bundle = Path(ckpt_path).parent
        return bundle if (bundle / CONTROLLER_FILE).exists() else None

    def _restorer(self, weights: list[tuple[str, torch.Tensor]]) -> BeforeStart | None:
        """On a bundle resume: load its rows and controller state, and give the engine the restored weights."""
        bundle = self.resume_bundle()
        if bundle is None:
            return None
        assert self.data_plane is not None
        state = read_controller_state(bundle)
        if state.get("rows_indexed", True):  # shadow mode or no save_data_plane: the groups are pending instead
            self.data_plane.load(bundle / DATA_PLANE_DIR)
        return resume_restorer(state, weights, group_size=self.config.algo.num_generations_per_prompt, source=bundle)

    def _group_source(self) -> GroupSource:
        """Where this rank's step stream gets its groups: the controller, through the leader's broadcast if any."""
        if self.ranks is None:
            return self._running_controller()
        if self.ranks.leader:
            return LeaderSelect(self._running_controller(), self.ranks)
        return FollowerSelect(self.ranks)

    def rl_steps(self) -> RLStepStream:
        """The train dataloader: one RL step per item, ``max_num_steps`` items at most."""
        if self.data_plane is None:
            raise RuntimeError("the Single-Controller strategy has not been set up")
        trainer = self.lightning_module.trainer
        self._allow_one_more_epoch()  # the loops are restored by now, and Lightning has not yet decided to run
        settings = StepSettings.from_config(self.config, pad_token_id=self.lightning_module.tokenizer.pad_token_id)
        return RLStepStream(
            self._group_source(),
            self.data_plane,
            settings,
            max_steps=self.config.algo.max_num_steps,
            version=lambda: trainer.global_step,
        )

    def teardown(self) -> None:
        """Stop the controller (its pump and engine), then the data plane, then the usual strategy teardown."""
        try:
            if self.controller is not None:
                if self.endpoint is not None:
                    self.controller.call(self.endpoint.stop())
                self.controller.shutdown()
        finally:
            self.controller, self.endpoint, self.endpoint_url = None, None, None
            if self._endpoint_socket is not None:  # closed already if the endpoint served on it
                self._endpoint_socket.close()
                self._endpoint_socket = None
            if self.data_plane is not None and self.leader:
                self.data_plane.close()
            self.data_plane = None
            super().teardown()  # type: ignore[misc]
