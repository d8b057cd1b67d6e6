"""default_engine_factory: the engine a config asks for, built from the config's knobs."""

from __future__ import annotations

import asyncio
import os

import pytest

from sc_lightning import default_engine_factory
from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.types import SamplingParams
from tests.helpers.fits import tiny_config

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]


def test_a_colocated_engine_decodes_at_most_max_batch_size_rows_at_once() -> None:
    config = tiny_config(
        "policy.generation.colocated.enabled=true", "policy.generation.mcore_generation_config.max_batch_size=3"
    )
    engine = default_engine_factory(config)
    assert isinstance(engine, MegatronEngine)
    widest = 0

    async def scenario() -> list:
        nonlocal widest
        tasks = [asyncio.create_task(engine.generate((1, 3 + i), SamplingParams(6, temperature=0.0))) for i in range(8)]
        while not all(task.done() for task in tasks):
            widest = max(widest, len(engine._batch.rows))
            await asyncio.sleep(0)
        await engine.shutdown()
        return [task.result() for task in tasks]

    generations = asyncio.run(scenario())
    assert all(len(g.token_ids) >= 1 for g in generations)
    assert widest == 3  # eight requests, three KV-cache rows: the others waited for a free row
    assert engine._batch.max_rows == 3


def test_engines_join_the_ray_cluster_ray_address_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-node run sets RAY_ADDRESS: the factory joins that cluster instead of starting one (Ray refuses CPU
    counts when joining, so none may be passed)."""
    import ray

    from sc_lightning.engines import factory

    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    factory.start_ray()
    monkeypatch.delenv("RAY_ADDRESS")
    factory.start_ray()
    assert calls[0] == {"address": "10.0.0.1:6379", "log_to_driver": False}
    assert "address" not in calls[1] and calls[1]["num_cpus"] >= 2


@pytest.mark.parametrize(
    ("overrides", "actors"),
    [
        (("policy.generation.colocated.enabled=true",), 0),  # in the trainer's process
        (("policy.generation.colocated.enabled=false",), 1),  # the Megatron engine in its own actor
        (("policy.generation.backend=vllm",), 1),  # one replica on a CPU box
        (
            (
                "policy.generation.backend=vllm",
                "policy.generation.vllm_cfg.tensor_parallel_size=2",
                "policy.generation.colocated.resources.gpus_per_node=4",
                "policy.generation.colocated.resources.num_nodes=2",
            ),
            4,  # 8 GPUs, 2 per replica
        ),
    ],
)
def test_the_engine_actor_count_is_the_number_of_actors_the_factory_starts(overrides: tuple, actors: int) -> None:
    from sc_lightning.engines.factory import engine_actor_count

    assert engine_actor_count(tiny_config(*overrides)) == actors


@pytest.mark.parametrize(
    ("device", "gpus_per_node", "replicas", "placement"),
    [
        ("cpu", 4, 0, "megatron engine in its own Ray actor"),  # a CPU run's one engine stays on the CPU
        ("cuda", None, 0, "megatron engine in its own Ray actor"),  # no engine GPUs: the actor on the CPU
        ("cuda", 1, 1, "megatron engine in its own Ray actor (a GPU of its own)"),
        ("cuda", 4, 4, "megatron engines in Ray actors (4 GPUs, a replica on each, requests routed to the least busy)"),
    ],
)
def test_a_non_colocated_megatron_engine_has_a_replica_on_each_engine_gpu(
    device: str, gpus_per_node: int | None, replicas: int, placement: str
) -> None:
    """The GPUs ``colocated.resources`` gives the Megatron engine each get a replica (the factory routes between
    several; tests/engines/test_router.py refits such a fleet through its weight groups), and the banner says so."""
    import torch

    from sc_lightning.engines.factory import megatron_engine_gpus
    from sc_lightning.rollout_side.banner import _placement

    config = tiny_config(
        "policy.generation.colocated.enabled=false",
        f"policy.generation.colocated.resources.gpus_per_node={gpus_per_node or 'null'}",
    )
    assert megatron_engine_gpus(config, torch.device(device)) == replicas
    assert _placement(config, device) == placement


def test_engine_gpus_are_the_nodes_last_and_a_local_ray_sees_only_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split placement on one node: the trainer's ranks take the first GPUs, the engines the last; the local Ray
    instance is started seeing only the engines' (it hands its actors the GPUs it sees), and this process's view
    is put back."""
    import ray

    from sc_lightning.engines import factory

    assert factory.engine_gpu_ids(["0", "1", "2", "3"], 1) == ["3"]
    assert factory.engine_gpu_ids(["4", "6"], 1) == ["6"]  # ids as CUDA_VISIBLE_DEVICES lists them
    with pytest.raises(ValueError, match=r"gpus_per_node \(2\) leaves none of this node's 2 GPUs"):
        factory.engine_gpu_ids(["0", "1"], 2)

    seen: list[str | None] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **_: seen.append(os.environ.get("CUDA_VISIBLE_DEVICES")))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    factory.start_ray(engine_gpus=1)
    assert seen == ["1"] and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    factory.start_ray()  # no engine GPUs (a CPU box, or colocated): Ray sees what this process sees
    assert seen == ["1", "0,1"]
