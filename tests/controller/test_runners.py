"""The same scenario through both homes of the controller: the product's thread and the benchmarked Ray actor."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import threading
import time
from collections.abc import Iterable

import pytest

from benchmarks.ray_controller import RayController
from sc_lightning.controller.api import ControllerClient, ControllerDied, ControllerUnresponsive, WaitInterrupted
from sc_lightning.controller.runners import LocalController
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.datasets import ArithmeticDataset
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.types import Prompt
from tests.helpers.actors import kill_and_wait
from tests.helpers.controllers import config
from tests.helpers.scripts import TOKENIZER, answer_correctly


def build(environment: ArithmeticEnvironment | None = None):
    """Runs inside the controller's home: everything, the in-process data plane included, is built there."""
    from sc_lightning.controller.build import build_controller

    return build_controller(
        config({"name": "in_order", "max_lookahead_versions": 1}, buffered=4),
        data_plane=MemoryDataPlane(),
        engine=ScriptedEngine(answer_correctly),
        environment=environment or ArithmeticEnvironment(),
        tokenizer=TOKENIZER,
        dataset=ArithmeticDataset(8, 0, TOKENIZER),
    )


def scenario(client: ControllerClient) -> list[tuple[str, int | None, int]]:
    """Four steps of two groups each, then exhaustion; returns (prompt, target, start weight) per trained group."""
    trained = []
    try:
        for version in range(4):
            chunk = client.select(version, 2, 2, timeout_s=60)
            assert chunk is not None
            trained += [(g.prompt_id, g.target_step, g.start_weight) for g in chunk]
            report = client.refit(version + 1, None)
            assert report.stats.trainer_version == version + 1
        assert client.select(4, 2, 2, timeout_s=60) is None
        stats = client.stats()
        assert (stats.committed, stats.selected, stats.buffer_permits_held) == (8, 8, 0)
    finally:
        client.shutdown()
    return trained


@pytest.mark.slow
def test_thread_and_ray_actor_run_the_same_scenario_identically(ray_cluster) -> None:
    local = scenario(LocalController(build))
    ray_client = RayController(build)
    remote = scenario(ray_client)
    targets = [target for _, target, _ in local]
    assert targets == [0, 0, 1, 1, 2, 2, 3, 3]
    assert local == remote  # same seeds, same prompts, same stamps, same weights
    with pytest.raises(ray_cluster.exceptions.RayActorError):  # shutdown left no actor behind
        ray_cluster.get(ray_client.actor.invoke.remote("stats", (), {}), timeout=30)


class SlowUpdateEngine(ScriptedEngine):
    """FAKE engine: a ScriptedEngine whose weight update takes 0.8 s."""

    async def update_weights(self, named_tensors: Iterable, version: int) -> None:
        await asyncio.sleep(0.8)
        await super().update_weights(named_tensors, version)


@pytest.mark.parametrize("refit_timeout_s", [2.0, None], ids=["longer", "none"])
def test_a_weight_update_longer_than_the_call_timeout_has_the_refit_deadline(refit_timeout_s: float | None) -> None:
    """policy.generation.refit_timeout_s bounds an engine's weight update, not the handle's call_timeout_s (0.5 s
    here): a 0.8 s update within a 2 s refit deadline, or with none (null), completes."""

    def slow_build():
        from sc_lightning.controller.build import build_controller

        cfg = config({"name": "in_order", "max_lookahead_versions": 1}, buffered=4)
        generation = dataclasses.replace(cfg.policy.generation, refit_timeout_s=refit_timeout_s)
        return build_controller(
            dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, generation=generation)),
            data_plane=MemoryDataPlane(),
            engine=SlowUpdateEngine(answer_correctly),
            environment=ArithmeticEnvironment(),
            tokenizer=TOKENIZER,
            dataset=ArithmeticDataset(8, 0, TOKENIZER),
        )

    client = LocalController(slow_build, call_timeout_s=0.5)
    try:
        client.begin_refit(1)
        client.push_weights([], 1)
        client.finish_refit(1)
        assert client.stats().trainer_version == 1
        assert client.refit(2, []).stats.trainer_version == 2  # the one-call refit too
    finally:
        client.shutdown()


def test_a_blocked_controller_loop_is_reported_by_the_trainer_side() -> None:
    """A synchronous call blocking the controller's event loop: the trainer's next call fails naming itself."""
    client = LocalController(build, call_timeout_s=0.5)
    unblock = threading.Event()
    try:
        client._loop.call_soon_threadsafe(unblock.wait, 60)  # the fault: user code blocking the loop
        with pytest.raises(ControllerUnresponsive, match=r"did not answer SingleController.evict\(0\) within 0.5 s"):
            client.evict(0)
        unblock.set()
        assert client.evict(0) == []  # unblocked, it answers again
    finally:
        unblock.set()
        client.shutdown()


@pytest.mark.slow
def test_a_dead_controller_actor_is_reported_by_the_trainer_side(ray_cluster) -> None:
    client = RayController(build)
    kill_and_wait(client.actor)
    with pytest.raises(ControllerDied, match=r"Ray actor died; SingleController.select got no answer"):
        client.select(0, 2, 2, timeout_s=60)
    client.shutdown()  # a dead controller shuts down quietly


class HangingArithmetic(ArithmeticEnvironment):
    """The arithmetic verifier whose scores hang until ``released`` is set."""

    def __init__(self, released: threading.Event) -> None:
        super().__init__()
        self.released = released

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """The arithmetic reward, once released."""
        self.released.wait(60)
        return super().score(prompt, completion_text)


def test_a_stop_signal_on_another_thread_ends_a_waiting_select_at_once() -> None:
    """The kernel may deliver a signal sent to the process to any of its threads, and Python runs the handler in the
    main thread only once that thread runs Python code again: a select waiting for rollouts that hang lets it run
    (FitStop's handler then ends the wait) instead of holding it until the rollouts come (a SIGTERM that once took a
    fit minutes to obey, tests/test_preemption.py)."""
    released = threading.Event()
    client = LocalController(lambda: build(HangingArithmetic(released)))
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: client.interrupt_waits())
    try:
        signalled = time.monotonic() + 0.5
        # the signal lands on the controller's thread, as the kernel may deliver one sent to the process
        threading.Timer(0.5, signal.pthread_kill, (client._thread.ident, signal.SIGUSR1)).start()
        with pytest.raises(WaitInterrupted):
            client.select(0, 2, 2, timeout_s=10)
        # at once: WaitInterrupted, not the select's own SelectTimeout at 10 s (the rollouts never come)
        assert time.monotonic() - signalled < 8.0
    finally:
        signal.signal(signal.SIGUSR1, previous)
        released.set()
        client.shutdown()


def test_a_handle_invokes_only_train_side_methods() -> None:
    """The transport runs controller methods by name: anything outside the train-side API is refused."""
    client = LocalController(build)
    try:
        with pytest.raises(AttributeError, match="'shutdown' is not a train-side method"):
            client._invoke("shutdown")
        assert client.stats().trainer_version == 0  # the controller still runs
    finally:
        client.shutdown()
