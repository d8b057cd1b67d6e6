"""RolloutSide: the Single-Controller's rollout side, for one trainer process or many, with no Lightning in it.

    side = RolloutSide(config, engine_factory)       # nothing starts yet
    side.ranks = RankGroup(...)                      # several trainer ranks: their metadata channel (else None)
    side.listen()                                    # the endpoint's port, taken before anything starts
    side.start(model)                                # after the policy is built (a collective over the ranks)
    for step in side.rl_steps(version=...):          # one item per RL step, until the rollouts run out
        ... train the step (sc_lightning/trainer/), one optimizer step ...
        side.refit(version)                          # push the new weights; dispatch reopens
        ... stop after max_num_steps steps (the stream's len(); Lightning's max_steps) ...
    side.shutdown()                                  # also after an exception or Ctrl-C

(``side.answer(prompts, environment, settings)`` answers prompts outside the training stream, with the weights the
engine holds: the ``generate`` command's pass.)

At :meth:`~RolloutSide.start` the leader rank — the only rank of a one-process run, global rank 0 of many — loads the
prompt dataset (a bad one fails here, before anything starts), then starts, in order: the data plane, the generation
engine (seeded with the policy's current weights), a distillation run's teachers (every prompt's route checked
first: :mod:`~sc_lightning.rollout_side.teachers`), and the controller with its rollout pump (on a background
thread). With ``expose_http_server`` on (``vllm_cfg`` or ``mcore_generation_config``, by backend) it also serves the
engine as an OpenAI-compatible endpoint on loopback (:attr:`~RolloutSide.endpoint_url`, on the backend's
``http_port``, which :meth:`~RolloutSide.listen` binds first: a port in use fails before anything starts, as an
EndpointPortError naming the knob); with ``env.name: external`` that endpoint also hands the rollouts to external
agents (:mod:`~sc_lightning.rollout.external`). The other ranks start nothing: they receive a handle on the data
plane and, for every selection, the leader's group metadata (:mod:`~sc_lightning.trainer.rank_sync`), and read their
own rows by key. :meth:`~RolloutSide.shutdown` stops what the leader started, in reverse order. Lightning's strategies
(:mod:`~sc_lightning.lightning.strategy`) hold one and call these from their hooks.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from sc_lightning.checkpoint.bundle import CONTROLLER_FILE, DATA_PLANE_DIR, read_controller_state
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
from sc_lightning.engines.decode_counters import read_decode_counters
from sc_lightning.engines.factory import context_tokens
from sc_lightning.rollout.answers import Answer, AnswerSettings, answer_prompts
from sc_lightning.rollout.datasets import build_dataset
from sc_lightning.rollout.envs import Environment, answer_check, build_environment
from sc_lightning.rollout.prompts import check_dataset_fits_steps
from sc_lightning.rollout.serving.listen import listen_on
from sc_lightning.rollout.serving.server import OpenAIEndpoint
from sc_lightning.rollout.teachers import TeacherScoring
from sc_lightning.rollout_side.parts import (
    EngineFactory,
    PolicyModel,
    RefitRecord,
    external_rollouts,
    http_api_key,
    http_host,
    http_knobs,
    http_server_port,
    rollout_snapshotter,
)
from sc_lightning.rollout_side.teachers import build_teacher_scoring
from sc_lightning.trainer.data_parallel import data_parallel_representative
from sc_lightning.trainer.rank_sync import FollowerSelect, LeaderSelect, RankGroup
from sc_lightning.trainer.refit_gather import policy_buckets
from sc_lightning.trainer.step_stream import GroupSource, RLStepStream, StepSettings
from sc_lightning.types import Prompt

Named = list[tuple[str, torch.Tensor]]


class RolloutSide:
    """Data plane, generation engine, controller (and endpoint), started on the leader rank; refits; stops them."""

    def __init__(self, config: SCConfig, engine_factory: EngineFactory, *, resume_state: Path | None = None) -> None:
        """``resume_state``: the bundle or rollout snapshot whose controller state and rows a resume loads (None:
        the bundle of the trainer checkpoint :meth:`start` is given, if that is one)."""
        self.config = config
        self.engine_factory = engine_factory
        self.resume_state = resume_state
        self.refit_bucket_bytes = int(config.policy.generation.refit_bucket_mb * 2**20)  # held at most in a refit
        self.ranks: RankGroup | None = None  # with several trainer ranks: their metadata channel
        self.data_plane: DataPlane | None = None
        self.controller: LocalController | None = None
        self.engine: GenerationEngine | None = None  # the leader's generation engine, once started
        self.teachers: TeacherScoring | None = None  # the leader's distillation teachers, once started (else None)
        self.endpoint: OpenAIEndpoint | None = None
        self.endpoint_url: str | None = None
        self.last_refit: RefitRecord | None = None
        self.accepts_megatron_weights = False  # whether the engine takes the live megatron parameters (see refit)
        self._model: PolicyModel | None = None
        self._endpoint_socket: socket.socket | None = None  # bound by listen, served by the endpoint
        self._step_clock = time.monotonic()  # the current RL step's start: the fit's, then each refit's end

    @property
    def leader(self) -> bool:
        """Whether this rank owns the controller, the data plane and the engine (always, in one process)."""
        return self.ranks is None or self.ranks.leader

    @property
    def colocated(self) -> bool:
        """Whether the engine shares the trainer's accelerator (``policy.generation.colocated.enabled``)."""
        return self.config.policy.generation.colocated.enabled

    def listen(self) -> None:
        """On the leader serving the endpoint: listen on its address and port now (taken, or not this machine's: an
        EndpointPortError naming the knob), before any model, engine or Ray starts."""
        port = http_server_port(self.config)
        if port is not None and self.leader and self._endpoint_socket is None:
            self._endpoint_socket = listen_on(http_host(self.config), port, http_knobs(self.config))

    def resume_bundle(self, trainer_checkpoint: str | Path | None = None) -> Path | None:
        """The bundle or snapshot a resume loads: ``resume_state``, else the bundle holding ``trainer_checkpoint``
        (the trainer checkpoint the fit resumes from), if it is one."""
        if self.resume_state is not None:
            return self.resume_state
        if trainer_checkpoint is None:
            return None
        bundle = Path(trainer_checkpoint).parent
        return bundle if (bundle / CONTROLLER_FILE).exists() else None

    def start(self, model: PolicyModel, *, trainer_checkpoint: str | Path | None = None) -> None:
        """Start (on the leader) or attach to (elsewhere) the rollout side for ``model``'s built policy; a collective
        over the ranks. ``trainer_checkpoint``: the trainer checkpoint a resume restores (see :meth:`resume_bundle`)."""
        self._model = model
        weights = self.policy_weights()  # every rank of the first replica takes part in gathering TP shards
        if self.leader:
            self._start_leader(model, weights, self.resume_bundle(trainer_checkpoint))
        if self.ranks is not None:
            self.data_plane = self.ranks.broadcast(self.data_plane)  # a handle: the others attach by key
        self.start_clock()

    def start_clock(self) -> None:
        """Start the first RL step's clock (the step time of the first :attr:`last_refit` counts from here)."""
        self._step_clock = time.monotonic()

    def _start_leader(self, model: PolicyModel, weights: Named, bundle: Path | None) -> None:
        config, tokenizer = self.config, model.tokenizer
        environment = build_environment(config.env)  # its answer check runs on every dataset row
        images = model.spec.vision  # a vision-language policy's image format (None: a text policy)
        check = answer_check(environment)
        dataset = build_dataset(config.data, tokenizer, seed=config.algo.seed, check_answer=check, images=images)
        check_dataset_fits_steps(config, len(dataset))  # bad rows and a too-small dataset fail before anything starts
        stall_s = config.async_rl.stall_watchdog.stall_timeout_s  # a read that long is a stall of the trainer
        self.data_plane = data_plane = build_data_plane(config.data_plane, read_timeout_s=stall_s)
        self.engine = engine = self.engine_factory(config, weights)  # here, on the main thread (it may start Ray)
        device = weights[0][1].device if weights else torch.device("cpu")
        self.teachers = teachers = build_teacher_scoring(config, tokenizer, dataset, device=device)
        self.accepts_megatron_weights = bool(getattr(engine, "accepts_megatron_weights", False))
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
                images=images,
                teachers=teachers,
            )
            if snapshotter is not None:
                controller.add_background_task("rollout snapshots", snapshotter.run)
            if external is not None:
                controller.manager.sample_source = external  # each sample: an agent's rollout, scored by the agent
            return controller

        self.controller = LocalController(build, before_start=self._restorer(bundle, weights))
        port = http_server_port(config)
        if port is not None:
            self.endpoint = OpenAIEndpoint(
                engine,
                tokenizer,
                model_name=config.policy.model_name,
                defaults=rollout_settings(config).sampling,
                context_tokens=context_tokens(config),
                host=http_host(config),
                port=port,
                sock=self._endpoint_socket,
                rollouts=external,
                api_key=http_api_key(config),
                generation_timeout_s=config.async_rl.rollout_failure.generation_timeout_s,
            )
            self.endpoint_url = self.controller.call(self.endpoint.start())  # on the loop that owns the engine

    def _restorer(self, bundle: Path | None, weights: Named) -> BeforeStart | None:
        """On a bundle resume: load its rows and controller state, and give the engine the restored weights."""
        if bundle is None:
            return None
        assert self.data_plane is not None
        state = read_controller_state(bundle)
        if state.get("rows_indexed", True):  # shadow mode or no save_data_plane: the groups are pending instead
            self.data_plane.load(bundle / DATA_PLANE_DIR)
        return resume_restorer(state, weights, group_size=self.config.algo.num_generations_per_prompt, source=bundle)

    def rl_steps(self, version: Callable[[], int]) -> RLStepStream:
        """The train side's stream: one RL step per item, ``max_num_steps`` items at most; ``version`` reads the
        trainer's weight version (the RL step about to train)."""
        if self.data_plane is None or self._model is None:
            raise RuntimeError("the rollout side has not been started")
        settings = StepSettings.from_config(self.config, pad_token_id=self._model.tokenizer.pad_token_id)
        return RLStepStream(
            self._group_source(), self.data_plane, settings, max_steps=self.config.algo.max_num_steps, version=version
        )

    def _group_source(self) -> GroupSource:
        """Where this rank's step stream gets its groups: the controller, through the leader's broadcast if any."""
        if self.ranks is None:
            return self._running_controller()
        if self.ranks.leader:
            return LeaderSelect(self._running_controller(), self.ranks)
        return FollowerSelect(self.ranks)

    def policy_weights(self) -> Named:
        """The model's whole policy under HF names, on the leader (the other ranks get an empty list): what the
        engine is built from at start. A collective over the ranks, like :meth:`policy_buckets`, whose buckets it
        joins."""
        return [pair for bucket, _ in self.policy_buckets() for pair in bucket]

    def policy_buckets(self) -> Iterator[tuple[Named, bool]]:
        """The model's policy under HF names as ``(bucket, last)`` on the leader, each bucket at most
        :attr:`refit_bucket_bytes` (or one module's tensors), gathered only when asked for; nothing on the other
        ranks. A collective: every rank must exhaust it (:mod:`~sc_lightning.trainer.refit_gather`: the first
        data-parallel replica exports, tensor-parallel shards are gathered, later pipeline stages send theirs)."""
        model = self._started_model()
        assert model.policy is not None, "the policy is built before the rollout side starts"
        return policy_buckets(model.policy, model.spec, self.ranks, bound=self.refit_bucket_bytes)

    def refit(self, version: int, *, trained: bool = True, wake: bool = False) -> RefitReport | None:
        """After the optimizer step that made ``version``: release the step, push the policy, reopen dispatch.

        The weights are pushed only when ``trained`` says the step changed the policy (a PPO critic warm-up does
        not); ``wake`` wakes a colocated engine before dispatch reopens. The controller calls are the leader's (the
        other ranks only help gather the weights, and get None); :attr:`last_refit` records the refit. An
        in-process Megatron engine takes the live megatron-named parameters in one call (it copies them before the
        call returns); any other engine gets the HF-named policy bucket by bucket (:meth:`_streamed_refit`).
        """
        started = time.monotonic()
        if not self.leader:
            for _ in self.policy_buckets() if trained else ():  # this rank's share of the gathers and sends
                pass
            return None
        controller = self._running_controller()
        decode = controller.call(read_decode_counters(self.engine), name="read_decode_counters")  # the step's work
        if trained and not self.accepts_megatron_weights:
            report = self._streamed_refit(controller, version, wake=wake)
        else:
            from sc_lightning.models.megatron import megatron_weights

            weights = megatron_weights(self._started_model().policy) if trained else None
            report = controller.refit(version, weights, wake=wake)
        finished = time.monotonic()
        step_s = finished - self._step_clock
        self.last_refit = RefitRecord(version, report, finished - started, finished, step_s, decode)
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

    def answer(
        self,
        prompts: Sequence[Prompt],
        environment: Environment,
        settings: AnswerSettings,
        *,
        timeout_s: float,
        on_answer: Callable[[Answer], None] | None = None,
    ) -> list[Answer]:
        """One answer per prompt from the engine, with the weights it holds now, scored by ``environment``
        (:func:`~sc_lightning.rollout.answers.answer_prompts` on the controller's loop, beside the rollouts, as a
        validation runs); a TimeoutError when the whole pass outlives ``timeout_s``. The leader's call."""
        controller = self._running_controller()
        assert self.engine is not None, "the engine starts with the controller"
        tokenizer = self._started_model().tokenizer
        passing = answer_prompts(prompts, self.engine, environment, tokenizer, settings, on_answer)
        limit = timeout_s + controller.call_timeout_s  # the pass's own deadline comes first
        return controller.call(asyncio.wait_for(passing, timeout_s), limit, name="answer_prompts")

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

    def interrupt_waits(self) -> None:
        """A stop signal: end the trainer's waits for rollouts (the leader's controller's; the other ranks wait on
        the leader). Returns at once: safe from a signal handler."""
        if self.controller is not None:
            self.controller.interrupt_waits()

    def _running_controller(self) -> LocalController:
        """The started controller; RuntimeError before ``start``, after ``shutdown`` or off the leader."""
        if self.controller is None:
            raise RuntimeError("the rollout side has not been started (or this rank is not the leader)")
        return self.controller

    def _started_model(self) -> PolicyModel:
        """The model :meth:`start` was given; RuntimeError before."""
        if self._model is None:
            raise RuntimeError("the rollout side has not been started")
        return self._model

    def shutdown(self) -> None:
        """Stop the endpoint and the controller (its pump and engine), then close the data plane (on the leader);
        safe to call twice, or after a failed start."""
        try:
            if self.controller is not None:
                if self.endpoint is not None:
                    self.controller.call(self.endpoint.stop())
                if self.teachers is not None:
                    self.controller.call(self.teachers.shutdown())
                self.controller.shutdown()
        finally:
            self.controller, self.endpoint, self.endpoint_url, self.engine = None, None, None, None
            self.teachers = None
            if self._endpoint_socket is not None:  # closed already if the endpoint served on it
                self._endpoint_socket.close()
                self._endpoint_socket = None
            if self.data_plane is not None and self.leader:
                self.data_plane.close()
            self.data_plane = None
