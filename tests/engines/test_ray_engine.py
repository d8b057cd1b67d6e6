"""RayMegatronEngine end to end: an actor replica, greedy parity, weight updates by value, errors, shutdown."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
import ray
import torch

from sc_lightning.engines.base import EngineError, GenerationEngine
from sc_lightning.models import export_hf_weights, load_policy, token_logprobs
from sc_lightning.types import SamplingParams
from tests.engines.helpers import follows_argmax
from tests.helpers.actors import kill_and_wait

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]
PROMPT = (4, 5, 6, 7)


def actor_alive(name: str) -> bool:
    """Whether a Ray actor called ``name`` is still registered."""
    try:
        ray.get_actor(name)
    except ValueError:
        return False
    return True


def test_ray_engine_end_to_end(ray_cluster: None, tiny_dirs: dict) -> None:
    from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine

    model_a = load_policy(str(tiny_dirs["a"]))[0].eval()
    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    model_b.eval()

    async def scenario() -> None:
        engine = RayMegatronEngine(str(tiny_dirs["a"]), name="ray-gen", actor_name="ray-gen-actor", stop_on_eos=False)
        assert isinstance(engine, GenerationEngine)
        await engine.ready()
        # the driver read the HF directory's config and tokenizer: the actor built its replica without transformers
        assert not await engine.actor.__ray_call__.remote(lambda _: "transformers" in sys.modules)
        greedy, sampled = await asyncio.gather(
            engine.generate(PROMPT, SamplingParams(10, temperature=0.0)),
            engine.generate(PROMPT, SamplingParams(10, temperature=0.7, seed=3)),
        )
        assert all(follows_argmax(model_a, PROMPT, greedy.token_ids)) and len(greedy.token_ids) == 10
        with torch.no_grad():
            trainer = token_logprobs(model_a, torch.tensor([PROMPT + sampled.token_ids]), temperature=0.7).cpu()
        assert torch.allclose(trainer[0, len(PROMPT) :], torch.tensor(sampled.logprobs), atol=1e-4)

        await engine.update_weights(export_hf_weights(model_b, spec_b), version=4)
        assert engine.weight_version == 4
        after = await engine.generate(PROMPT, SamplingParams(10, temperature=0.0))
        assert after.weight_version == 4 and all(follows_argmax(model_b, PROMPT, after.token_ids))
        assert (greedy.token_versions, after.token_versions) == ((0,) * 10, (4,) * 10)  # across the Ray transport

        await engine.stand_down()  # decoding holds, and so does the clock of the engine's deadlines
        expiring = asyncio.create_task(engine.active_wait_for(asyncio.Event().wait(), 0.2))
        queued = asyncio.create_task(engine.generate(PROMPT, SamplingParams(3)))
        await asyncio.sleep(0.4)
        assert not expiring.done() and not queued.done()
        await engine.wake()
        assert len((await queued).token_ids) == 3
        with pytest.raises(TimeoutError):
            await expiring  # awake, its 0.2 s run out
        assert (await engine.stats())["batches"] >= 3

        with pytest.raises(EngineError, match=r"engine 'ray-gen', request req-\d+"):
            await engine.generate(tuple([3] * 300), SamplingParams(4))

        # the requests of one loop turn travel in one actor call, yet each keeps its own outcome and cancellation;
        # decoding holds (stood down) until the cancel has reached the actor, so the long request cannot finish first
        before = await engine.stats()
        await engine.stand_down()
        long = asyncio.create_task(engine.generate(PROMPT, SamplingParams(200, temperature=0.0)))
        good = asyncio.create_task(engine.generate(PROMPT, SamplingParams(2)))
        bad = asyncio.create_task(engine.generate(tuple([3] * 300), SamplingParams(2)))
        with pytest.raises(EngineError, match=r"engine 'ray-gen', request req-\d+: prompt of 300"):
            await bad  # refused at once, its batch-mates still held
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        await engine.stats()  # returns once the cancel has landed
        await engine.wake()
        assert len((await good).token_ids) == 2
        after_cancel = await engine.stats()
        assert after_cancel["finished_requests"] == before["finished_requests"] + 1
        assert after_cancel["generated_tokens"] == before["generated_tokens"] + 2  # none of the long request's 200
        assert len((await engine.generate(PROMPT, SamplingParams(3))).token_ids) == 3

        assert actor_alive("ray-gen-actor")
        await engine.shutdown()
        await engine.shutdown()  # idempotent
        with pytest.raises(EngineError, match="shut down"):
            await engine.generate(PROMPT, SamplingParams(2))

    asyncio.run(scenario())
    deadline = time.monotonic() + 30
    while actor_alive("ray-gen-actor") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not actor_alive("ray-gen-actor")


def test_weights_ship_as_arrays_and_arrive_with_their_names_dtypes_and_values(ray_cluster: None) -> None:
    from sc_lightning.engines.actor_client import received_weights, ship_by_value

    sent = [
        ("fp32", torch.randn(3, 4)),
        ("bf16", torch.randn(5).to(torch.bfloat16)),  # no numpy dtype: travels as int16 bits
        ("fp16", torch.randn(2, 2).half()),
        ("int64", torch.arange(4)),
        ("transposed", torch.randn(4, 3).t()),  # not contiguous
    ]
    received = received_weights(ray.get(ship_by_value(sent)))
    assert [name for name, _ in received] == [name for name, _ in sent]
    for (_, before), (_, after) in zip(sent, received, strict=True):
        assert after.dtype == before.dtype and torch.equal(after, before)


def test_a_refit_by_broadcast_loads_the_weights_a_refit_by_value_does(ray_cluster: None, tiny_dirs: dict) -> None:
    """Through the weight group (gloo here, NCCL between GPUs) the actor loads the very weights, in buckets too."""
    from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine

    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    model_b.eval()
    weights = list(export_hf_weights(model_b, spec_b))

    async def scenario() -> None:
        engine = RayMegatronEngine(str(tiny_dirs["a"]), name="ray-broadcast", stop_on_eos=False)
        try:
            await engine.ready()
            await engine.open_weight_group("cpu", timeout_s=60)
            half = len(weights) // 2
            await engine.stage_weights(weights[:half], version=3)
            assert engine.weight_version == 0  # a bucket: the version stays
            await engine.update_weights(weights[half:], version=3)
            assert engine.weight_version == 3
            after = await engine.generate(PROMPT, SamplingParams(10, temperature=0.0))
            assert after.weight_version == 3 and all(follows_argmax(model_b, PROMPT, after.token_ids))
        finally:
            await engine.shutdown()

    asyncio.run(scenario())


def test_a_refit_by_broadcast_to_a_dead_actor_is_an_engine_error_naming_it(ray_cluster: None, tiny_dirs: dict) -> None:
    from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine

    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    weights = list(export_hf_weights(model_b, spec_b))

    async def scenario() -> None:
        engine = RayMegatronEngine(str(tiny_dirs["a"]), name="ray-dead", stop_on_eos=False)
        await engine.ready()
        await engine.open_weight_group("cpu", timeout_s=30)  # its setup under a loaded machine; the dead actor ends it
        kill_and_wait(engine.actor)  # dead before the refit: a kill under way may still take it
        started = time.monotonic()
        with pytest.raises(EngineError, match=r"engine 'ray-dead', refit to version 2"):
            await engine.update_weights(weights, version=2)
        assert time.monotonic() - started < 60  # the dead actor or the group's deadline, never a hang
        await engine.shutdown()

    asyncio.run(scenario())
