"""Chaos tests for generation-engine failures: real Ray actors killed or frozen in the middle of real runs.

- **survivors**: a GRPO fit whose engine is an :class:`EngineRouter` over three :class:`RayMegatronEngine` actors;
  one replica is killed while it serves a prompt group (the group is redispatched to the survivors) and another
  while it is idle between two rollouts (the next refit finds it dead); the run completes on the last replica.
- **none left**: every replica is killed mid-rollout; the run stops fast with an error naming the prompt, the
  router and each dead replica, and the bundle it wrote before resumes with fresh engines to the end.
- **hung engine** (the controller with a real engine, no trainer: the deadline is the rollout side's): the
  engine's actor process is frozen (SIGSTOP), so requests never answer; the generation deadline fires on every
  attempt and the rollout pump stops with a timeout naming the prompt and the engine.

Everything is real (megatron-core policy and engines, controller, data plane, Lightning Trainer, refit callback);
only the failures are injected. "Mid-request" is made deterministic by freezing the victim first: its requests
cannot finish, so the test waits (polling the router, with a deadline) until one is outstanding, then kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from sc_lightning.callbacks.checkpoint import BundleCheckpoint
from sc_lightning.checkpoint.snapshots import config_identity, resume_point
from sc_lightning.config import SCConfig, load_config
from sc_lightning.config.yaml_io import load_yaml_layers
from sc_lightning.controller.api import ControllerStats, RolloutPumpError
from sc_lightning.controller.build import build_controller
from sc_lightning.controller.controller import SingleController
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.engines.base import EngineError, GenerationEngine
from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine
from sc_lightning.engines.router import EngineRouter
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.models.warm_start import resolve_model_name
from sc_lightning.rollout.datasets import build_dataset
from sc_lightning.rollout.envs import build_environment
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import SamplingParams
from tests.helpers.actors import kill_and_wait
from tests.helpers.configs import TEST_BASE
from tests.helpers.fits import tiny_trainer

pytestmark = pytest.mark.slow

GENERATIONS_PER_STEP = 16  # 4 groups x 4 generations (tests/small_steps.yaml)
# Engines in Ray actors, synchronous (generation for step k+1 starts once step k has trained and refit), so a
# replica is busy only between a refit and the next step; the in-process data plane; quick retries.
CHAOS = (
    "policy.generation.colocated.enabled=false",
    "data_plane.backend=memory",
    "async_rl.rollout_failure.backoff_base_s=0.05",
)


def chaos_config(*overrides: str) -> SCConfig:
    """The tests' base config (TEST_BASE) with :data:`CHAOS` and ``overrides`` on top."""
    raw = load_yaml_layers(TEST_BASE, [*CHAOS, *overrides])
    return load_config(raw, extra_top_level=("trainer", "seed_everything"))


def megatron_replica(config: SCConfig, name: str) -> RayMegatronEngine:
    """A fresh :class:`RayMegatronEngine` actor built from the policy's initial model, as the default factory
    builds its one engine."""
    policy, seed = config.policy, config.algo.seed
    return RayMegatronEngine(
        resolve_model_name(policy.model_name, seed=seed),
        name=name,
        precision=policy.precision,
        seed=seed,
        tokenizer_name=policy.tokenizer_name,
        max_seq_len=policy.max_total_sequence_length,
    )


class FreezingRouter(EngineRouter):
    """The real router plus one injected fault: right after its refit to version ``freeze_at`` has landed (before
    the controller reopens dispatch) it freezes (SIGSTOP) the actor processes of the replicas ``freeze``, so every
    request routed to them from then on stays outstanding until the test kills them."""

    def __init__(self, replicas: Sequence[RayMegatronEngine], freeze_at: int | None, freeze: Sequence[int]) -> None:
        """Route over ``replicas`` (named ``router``); freeze replicas ``freeze`` after the refit to ``freeze_at``."""
        super().__init__(replicas, name="router")
        self.freeze_at, self.freeze = freeze_at, tuple(freeze)
        self.frozen_pids: list[int] = []

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """The router's refit; then, at ``freeze_at``, the freeze."""
        await super().update_weights(named_tensors, version)
        if version == self.freeze_at:
            for index in self.freeze:
                pid = await actor_pid(self.replicas[index])
                os.kill(pid, signal.SIGSTOP)
                self.frozen_pids.append(pid)


class Replicated:
    """Engine factory: a :class:`FreezingRouter` over ``replicas`` fresh :class:`RayMegatronEngine` actors (each
    built from the policy's initial model, as the default factory builds one); remembers each router it built."""

    def __init__(self, replicas: int, *, freeze_at: int | None = None, freeze: Sequence[int] = ()) -> None:
        """``replicas`` per router; ``freeze_at`` / ``freeze`` go to each :class:`FreezingRouter`."""
        self.replicas, self.freeze_at, self.freeze = replicas, freeze_at, freeze
        self.routers: list[FreezingRouter] = []

    def __call__(self, config: SCConfig, initial_weights: list[tuple[str, torch.Tensor]]) -> FreezingRouter:
        """Start the replicas (they build their models concurrently) and put them behind a router."""
        replicas = [megatron_replica(config, f"megatron-{i}") for i in range(self.replicas)]
        self.routers.append(FreezingRouter(replicas, self.freeze_at, self.freeze))
        return self.routers[-1]

    @property
    def router(self) -> FreezingRouter:
        """The router of the latest run."""
        return self.routers[-1]


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.005)


async def actor_pid(engine: RayMegatronEngine) -> int:
    """The OS process id of the engine's Ray actor."""

    def pid(actor: Any) -> int:
        """Runs in the actor: its process id."""
        return os.getpid()

    return await engine.actor.__ray_call__.remote(pid)


def thaw(pids: Sequence[int]) -> None:
    """SIGCONT the processes still alive (a killed actor's process then exits)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def kill_frozen(router: FreezingRouter) -> None:
    """``ray.kill`` the frozen replicas once each has a generation request outstanding, then thaw the processes."""
    assert router.frozen_pids, "the freeze happened at this refit"
    try:
        wait_until(lambda: all(router.outstanding[i] > 0 for i in router.freeze), f"requests on {router.freeze}")
        for index in router.freeze:
            ray.kill(router.replicas[index].actor, no_restart=True)
    finally:
        thaw(router.frozen_pids)


def finished_requests(trainer: Trainer, engine: RayMegatronEngine) -> int:
    """How many requests ``engine`` has finished (asked on the controller's loop, which owns the client)."""
    return trainer.strategy.rollout_side.controller.call(engine.stats())["finished_requests"]


def controller_over(config: SCConfig, engine: GenerationEngine) -> SingleController:
    """A controller (no trainer) over ``engine``, with the config's environment and dataset, the in-process data
    plane and the character tokenizer."""
    tokenizer = CharTokenizer()
    return build_controller(
        config,
        data_plane=MemoryDataPlane(),
        engine=engine,
        environment=build_environment(config.env),
        tokenizer=tokenizer,
        dataset=build_dataset(config.data, tokenizer, seed=config.algo.seed),
    )


def fit(config: SCConfig, engines: Replicated, callbacks: Sequence[Callback], root: Path, **fit_kwargs: Any) -> Trainer:
    """One in-process fit: our strategy with ``engines`` as the engine factory, the refit callback, ``callbacks``."""
    resume_state = fit_kwargs.pop("resume_state", None)
    trainer = tiny_trainer(config, engines, callbacks, root=root, resume_state=resume_state)
    trainer.fit(GRPOModule(config), **fit_kwargs)
    return trainer


class KillOneBusyOneIdle(Callback):
    """After the refit that froze replica 0 (the end of step 0), kills it while it serves step 1's groups; at the
    start of step 2 (nothing in flight), kills replica 1; records the last replica's finished requests from then on.
    """

    def __init__(self, engines: Replicated) -> None:
        """Kill replicas of the routers ``engines`` builds."""
        self.engines = engines
        self.idle_at_kill: list[int] = []
        self.served: list[int] = []  # the survivor's finished requests: at the idle kill, then after each step

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After the freezing refit (dispatch has reopened): the busy kill; after later steps: the survivor's count."""
        router = self.engines.router
        if trainer.global_step == router.freeze_at:
            kill_frozen(router)
        elif self.served:
            self.served.append(finished_requests(trainer, router.replicas[2]))

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Step 2 starts: its groups are generated and the next ones wait for its refit, so replica 1 is idle."""
        if trainer.global_step == 2:
            router = self.engines.router
            self.idle_at_kill = list(router.outstanding)
            self.served.append(finished_requests(trainer, router.replicas[2]))
            kill_and_wait(router.replicas[1].actor)  # before the refit: ray.kill returns before the actor ends


def test_killed_replicas_busy_or_idle_leave_the_run_to_the_survivor(ray_cluster: None, tmp_path: Path) -> None:
    """Three replicas; one killed mid-request (its group is redispatched), one killed idle (the refit skips it)."""
    steps, engines = 5, Replicated(3, freeze_at=1, freeze=[0])
    killer = KillOneBusyOneIdle(engines)
    trainer = fit(chaos_config(f"grpo.max_num_steps={steps}"), engines, [killer], tmp_path)

    assert trainer.global_step == steps, "the run completed all its steps"
    metrics = trainer.callback_metrics
    assert metrics["rollout/redispatch_total"] >= 1 and metrics["rollout/infra_failures_total"] >= 1
    assert metrics["rollout/data_failures_total"] == 0
    router = engines.router
    assert sorted(router.dead) == ["megatron-0", "megatron-1"]
    assert "actor died" in router.dead["megatron-0"]  # the failing generation request named it
    assert "refit to version 3" in router.dead["megatron-1"] and "actor died" in router.dead["megatron-1"]
    assert killer.idle_at_kill == [0, 0, 0], "the second kill landed with nothing in flight"
    # steps 3 and 4 (0-based) were generated after replica 1's death was found: by the survivor alone
    assert len(killer.served) == steps - 1
    assert killer.served[-1] - killer.served[0] >= (steps - 3) * GENERATIONS_PER_STEP


class KillFrozen(Callback):
    """After the refit that froze replicas (and the bundle of that step), kills them while they serve the next
    step's groups; remembers when."""

    def __init__(self, engines: Replicated) -> None:
        """Kill the frozen replicas of the routers ``engines`` builds."""
        self.engines = engines
        self.killed_at: float | None = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """At the freezing step: the kill."""
        if trainer.global_step == self.engines.router.freeze_at:
            kill_frozen(self.engines.router)
            self.killed_at = time.monotonic()


def test_with_no_replica_left_the_run_fails_fast_naming_them_and_resumes_from_its_bundle(
    ray_cluster: None, tmp_path: Path
) -> None:
    """Two replicas, a bundle after every step; both killed while serving step 2 (0-based, after the bundle
    step_2 was written): the run stops within 60 s, naming the
    prompt, the router and both replicas, and the same run resumed with fresh engines trains to the end."""
    steps = 4
    config = chaos_config(
        f"grpo.max_num_steps={steps}",
        "checkpointing.enabled=true",
        "checkpointing.save_data_plane=true",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        "checkpointing.save_period=1",
        "data.train_data_log=true",
    )
    engines = Replicated(2, freeze_at=2, freeze=[0, 1])
    killer = KillFrozen(engines)
    bundles = BundleCheckpoint(config.checkpointing, max_steps=steps)
    with pytest.raises(RolloutPumpError) as failure:
        fit(config, engines, [bundles, killer], tmp_path)
    failed_at = time.monotonic()
    assert killer.killed_at is not None and failed_at - killer.killed_at < 60
    message = str(failure.value)
    assert "rollout pump failed: prompt arithmetic-" in message and "engine router)" in message
    assert "EngineError: engine 'router': no healthy replica left (" in message
    for name in ("megatron-0", "megatron-1"):  # listed with the generation request that found it dead
        assert f"{name}: engine '{name}', client request " in message
    notes = getattr(failure.value.__cause__, "__notes__", [])
    assert notes == ["gave up after 5 attempts (5 infra, 0 data)"]  # the default infra budget, spent

    resume = resume_point(
        Path(config.checkpointing.checkpoint_dir), config.rollout_checkpointing.restore_mode, config_identity(config)
    )
    assert resume is not None and resume.state_dir.name == "step_2"
    fresh = Replicated(2)
    trainer = fit(
        config,
        fresh,
        [BundleCheckpoint(config.checkpointing, max_steps=steps)],
        tmp_path,
        resume_state=resume.state_dir,
        ckpt_path=str(resume.trainer_checkpoint),
    )
    assert trainer.global_step == steps and not fresh.router.dead
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    assert sorted({row["step"] for row in rows}) == list(range(steps))
    per_prompt = Counter(row["prompt_index"] for row in rows)
    assert len(per_prompt) == steps * 4 and set(per_prompt.values()) == {4}, "each prompt trained once, whole"


def test_a_hung_engine_hits_the_generation_deadline_on_every_attempt(ray_cluster: None) -> None:
    """A real engine frozen once it is up never answers: each attempt's requests time out after
    generation_timeout_s (infra failures, retried), then the pump stops with the timeout naming the prompt and the
    engine."""
    config = chaos_config("async_rl.rollout_failure.generation_timeout_s=0.5")
    engine = megatron_replica(config, "megatron-0")

    async def scenario() -> tuple[float, RolloutPumpError, ControllerStats]:
        """Start the engine, freeze it, run the controller until it fails; thaw it and check it answers again."""
        await engine.ready()  # startup is not part of the deadline under test
        controller = controller_over(config, engine)
        pid = await actor_pid(engine)
        os.kill(pid, signal.SIGSTOP)
        try:
            await controller.start()
            started = time.monotonic()
            with pytest.raises(RolloutPumpError) as failure:
                await controller.select(0, 4, 4, timeout_s=60)
            elapsed = time.monotonic() - started
            stats = controller.stats()
            thaw([pid])
            thawed = await engine.generate((1, 2, 3), SamplingParams(2))
            assert thawed.token_ids and thawed.weight_version == 0, "it answers again: only the freeze stopped it"
            return elapsed, failure.value, stats
        finally:
            thaw([pid])
            await controller.shutdown()

    elapsed, error, stats = asyncio.run(scenario())
    assert elapsed < 30, "the deadline fired, not the select's own timeout"
    assert "engine megatron-0): generation exceeded generation_timeout_s=0.5" in str(error)
    assert getattr(error.__cause__, "__notes__", []) == ["gave up after 5 attempts (5 infra, 0 data)"]
    assert stats.infra_failures >= 5 and stats.committed == 0


def test_a_hung_replica_behind_the_router_is_routed_around(ray_cluster: None, caplog: pytest.LogCaptureFixture) -> None:
    """One of two replicas frozen from the start: its requests time out (infra failures, retried), the router
    stops sending it requests once they go unanswered, and the step's groups all commit on the other replica."""
    config = chaos_config("async_rl.rollout_failure.generation_timeout_s=1.0")
    replicas = [megatron_replica(config, f"megatron-{i}") for i in range(2)]
    router = EngineRouter(replicas, name="router")

    async def scenario() -> tuple[list, ControllerStats, list[int]]:
        """Start both replicas, freeze the first, train-select one step through the controller."""
        await asyncio.gather(*(replica.ready() for replica in replicas))
        controller = controller_over(config, router)
        pid = await actor_pid(replicas[0])
        os.kill(pid, signal.SIGSTOP)
        try:
            await controller.start()
            chunk = await controller.select(0, 4, 4, timeout_s=120)
            served = [(await replica.stats())["finished_requests"] for replica in replicas[1:]]
            return chunk, controller.stats(), served
        finally:
            thaw([pid])
            await controller.shutdown()

    with caplog.at_level("WARNING", logger="sc_lightning.engines.router"):
        chunk, stats, served = asyncio.run(scenario())
    assert "replica 'megatron-0' left 3 requests in a row unanswered" in caplog.text  # the log names the hung one
    assert chunk is not None and len(chunk) == 4, "the step's four groups committed"
    assert stats.infra_failures >= 1 and stats.redispatched >= 1 and stats.data_failures == 0
    assert router.unanswered[0] >= 1 and router.unanswered[1] == 0 and not router.dead
    assert served[0] >= GENERATIONS_PER_STEP  # the live replica generated every committed generation


def test_control_calls_to_a_hung_engine_have_deadlines_and_shutdown_kills_it(ray_cluster: None) -> None:
    """A frozen engine actor: stats fails after control_timeout_s naming the engine; shutdown still ends it."""
    engine = megatron_replica(chaos_config(), "megatron-0")

    async def scenario() -> tuple[str, float]:
        """Freeze the started engine, ask it for stats, shut it down without thawing it."""
        await engine.ready()
        pid = await actor_pid(engine)
        actor = engine.actor
        os.kill(pid, signal.SIGSTOP)
        try:
            engine.control_timeout_s = 0.5
            with pytest.raises(EngineError) as failure:
                await engine.stats()
            started = time.monotonic()
            await engine.shutdown()  # gets no answer within the deadline: kills the actor anyway
            took = time.monotonic() - started
            with pytest.raises(ray.exceptions.RayActorError):
                await actor.stats.remote()
            return str(failure.value), took
        finally:
            thaw([pid])

    message, took = asyncio.run(scenario())
    assert message == "engine 'megatron-0', stats: no answer within 0.5 s"
    assert took < 10
