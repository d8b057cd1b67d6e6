"""EngineRouter over two real Megatron engine replicas in Ray actors: spreading, refits, a dead replica."""

from __future__ import annotations

import asyncio

import pytest

from sc_lightning.engines.base import EngineError, GenerationEngine
from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine
from sc_lightning.engines.router import EngineRouter
from sc_lightning.models import export_hf_weights, load_policy
from sc_lightning.models.convert import export_hf_units
from sc_lightning.types import SamplingParams
from tests.engines.helpers import follows_argmax
from tests.helpers.actors import kill_and_wait

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("model_parallel")]
PROMPT = (4, 5, 6, 7)


def test_router_spreads_requests_refits_all_and_survives_a_dead_replica(ray_cluster: None, tiny_dirs: dict) -> None:
    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    model_b.eval()

    async def scenario() -> None:
        replicas = [RayMegatronEngine(str(tiny_dirs["a"]), name=f"r{i}", stop_on_eos=False) for i in range(2)]
        router = EngineRouter(replicas, name="fleet")
        assert isinstance(router, GenerationEngine)
        try:
            await asyncio.gather(*(replica.ready() for replica in replicas))
            outputs = await asyncio.gather(*(router.generate(PROMPT, SamplingParams(4, seed=i)) for i in range(6)))
            assert all(len(out.token_ids) == 4 for out in outputs)
            served = [(await replica.stats())["finished_requests"] for replica in replicas]
            assert served == [3, 3], "six concurrent requests alternate between two idle replicas"

            units = list(export_hf_units(model_b, spec_b))
            for unit in units[:-1]:  # a refit in buckets (one module each): the version comes with the last
                await router.stage_weights(unit, version=1)
            assert [replica.weight_version for replica in replicas] == [0, 0]
            await router.update_weights(units[-1], version=1)
            assert [replica.weight_version for replica in replicas] == [1, 1] and router.weight_version == 1
            greedy = await asyncio.gather(*(router.generate(PROMPT, SamplingParams(6, temperature=0.0)) for _ in "ab"))
            assert all(all(follows_argmax(model_b, PROMPT, g.token_ids)) for g in greedy)

            kill_and_wait(replicas[0].actor)  # dead before the request: a kill under way may still serve it
            with pytest.raises(EngineError, match="engine 'r0'.*actor died"):
                await router.generate(PROMPT, SamplingParams(2))  # least loaded is r0: its death is attributed
            assert list(router.dead) == ["r0"]
            survivors = await asyncio.gather(*(router.generate(PROMPT, SamplingParams(2)) for _ in range(3)))
            assert all(len(out.token_ids) == 2 for out in survivors)  # r1 serves everything now
            await router.update_weights([(n, t.clone()) for n, t in export_hf_weights(model_b, spec_b)], version=2)
            assert replicas[1].weight_version == 2 and router.weight_version == 2

            kill_and_wait(replicas[1].actor)  # while idle: the next refit finds it dead, the last one
            weights = [(n, t.clone()) for n, t in export_hf_weights(model_b, spec_b)]
            with pytest.raises(EngineError, match=r"(?s)no healthy replica left \(r0: .*; r1: engine 'r1', refit to"):
                await router.update_weights(weights, version=3)
            with pytest.raises(EngineError, match=r"(?s)engine 'fleet': no healthy replica left \(r0: .*; r1: "):
                await router.generate(PROMPT, SamplingParams(2))
        finally:
            await router.shutdown()

    asyncio.run(scenario())


def test_router_needs_distinct_replica_names() -> None:
    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

    with pytest.raises(ValueError, match="unique"):
        EngineRouter([Named("x"), Named("x")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at least one"):
        EngineRouter([])


def test_replicas_refit_through_weight_groups_of_their_own_all_load_the_weights(
    ray_cluster: None, tiny_dirs: dict
) -> None:
    """A Megatron engine fleet on a GPU box (engines/factory.py: a replica per engine GPU, each with its weight group):
    here on gloo, the router's refit broadcasts to both replicas at once, in buckets too, and each holds the weights."""
    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    model_b.eval()
    units = list(export_hf_units(model_b, spec_b))

    async def scenario() -> None:
        replicas = [RayMegatronEngine(str(tiny_dirs["a"]), name=f"g{i}", stop_on_eos=False) for i in range(2)]
        router = EngineRouter(replicas, name="grouped")
        try:
            await asyncio.gather(*(replica.ready() for replica in replicas))
            await asyncio.gather(*(replica.open_weight_group("cpu", timeout_s=60) for replica in replicas))
            for unit in units[:-1]:
                await router.stage_weights(unit, version=2)
            await router.update_weights(units[-1], version=2)
            assert [replica.weight_version for replica in replicas] == [2, 2]
            for replica in replicas:  # each replica answers on its own weights: model b's
                greedy = await replica.generate(PROMPT, SamplingParams(8, temperature=0.0))
                assert greedy.weight_version == 2 and all(follows_argmax(model_b, PROMPT, greedy.token_ids))
        finally:
            await router.shutdown()

    asyncio.run(scenario())
