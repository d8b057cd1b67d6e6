"""MegatronEngine control: weight updates in flight, colocated stand-down / wake, active-time deadlines."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
import torch

from sc_lightning.engines.base import EngineError
from sc_lightning.engines.megatron.clock import ActiveClock
from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.models import export_hf_weights, load_policy, token_logprobs
from sc_lightning.models.convert import export_hf_units
from sc_lightning.models.megatron import megatron_weights
from sc_lightning.types import SamplingParams
from tests.engines.helpers import WorkerGate, follows_argmax

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]
PROMPT = (4, 5, 6, 7, 8)


def engine_on(path: Path | str, *, overlap: bool = False, **kwargs: object) -> MegatronEngine:
    """An engine on a fresh replica of ``path``, ignoring eos (fixed-length outputs).

    ``overlap`` queues each decode step before the previous one is read, as on a GPU.
    """
    engine = MegatronEngine.from_pretrained(str(path), stop_on_eos=False, **kwargs)
    engine._batch.overlap = overlap  # before any request: the worker reads it at each step
    return engine


@pytest.mark.parametrize("layout", ["hf", "megatron"])
def test_update_weights_switches_outputs_and_version(tiny_dirs: dict, layout: str) -> None:
    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    model_a = load_policy(str(tiny_dirs["a"]))[0].eval()
    # the megatron layout: what a colocated trainer pushes (its live parameters, copied straight in)
    weights = export_hf_weights(model_b, spec_b) if layout == "hf" else megatron_weights(model_b)

    async def scenario() -> tuple:
        engine = engine_on(tiny_dirs["a"])
        before = await engine.generate(PROMPT, SamplingParams(10, temperature=0.0))
        await engine.update_weights(weights, version=5)
        after = await engine.generate(PROMPT, SamplingParams(10, temperature=0.0))
        version = engine.weight_version
        replica = dict(megatron_weights(engine._model))
        partial = megatron_weights(model_b)
        dropped, _ = partial.pop()
        with pytest.raises(EngineError, match=re.escape(f"missing ['{dropped}']")):
            await engine.update_weights(partial, version=6)  # a partial set is refused
        await engine.shutdown()
        return before, after, version, replica

    before, after, version, replica = asyncio.run(scenario())
    assert all(torch.equal(replica[name], param) for name, param in megatron_weights(model_b))
    assert version == 5 and before.weight_version == 0 and after.weight_version == 5
    assert all(follows_argmax(model_a, PROMPT, before.token_ids))
    assert all(follows_argmax(model_b.eval(), PROMPT, after.token_ids))
    assert before.token_ids != after.token_ids


@pytest.mark.parametrize(
    ("overlap", "kv_cache_layout"),
    [(False, "slots"), (True, "slots"), (True, "paged")],
    ids=["eager", "overlap", "paged"],
)
def test_a_request_in_flight_across_an_update_finishes_on_the_new_weights(
    tiny_dirs: dict, overlap: bool, kv_cache_layout: str
) -> None:
    """The request's rows recompute their K/V on the new weights (a paged cache gives its blocks back and takes new
    ones, outside the decode loop's inference mode)."""
    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    model_a = load_policy(str(tiny_dirs["a"]))[0].eval()

    async def scenario() -> object:
        engine = engine_on(tiny_dirs["a"], overlap=overlap, kv_cache_layout=kv_cache_layout)
        gate = WorkerGate(engine, 5)
        task = asyncio.create_task(engine.generate(PROMPT, SamplingParams(200, temperature=0.0)))
        await (await gate.during(engine.update_weights(export_hf_weights(model_b, spec_b), version=1)))
        result = await task
        await engine.shutdown()
        return result

    result = asyncio.run(scenario())
    assert result.finish_reason == "length" and len(result.token_ids) == 200
    assert result.weight_version == 0  # the version at its start
    on_a = follows_argmax(model_a, PROMPT, result.token_ids)
    on_b = follows_argmax(model_b.eval(), PROMPT, result.token_ids)
    switch = [k for k in range(1, 200) if all(on_a[:k]) and all(on_b[k:])]
    assert switch, "expected tokens of model a, then (after the update) tokens of model b"
    assert_versions_split_at_the_refit(result.token_versions, 0, 1, on_a, on_b)


def assert_versions_split_at_the_refit(
    versions: tuple[int, ...], old: int, new: int, on_old: list[bool], on_new: list[bool]
) -> None:
    """The completion's tokens carry ``old`` then ``new``, and the split is where the sampling model changed: every
    token stamped ``old`` follows the old model's argmax, every one stamped ``new`` the new model's."""
    split = versions.index(new)
    assert split > 0 and versions == (old,) * split + (new,) * (len(versions) - split)
    assert all(on_old[:split]) and all(on_new[split:])


def test_weights_in_buckets_hold_decoding_and_the_version_until_the_last(tiny_dirs: dict) -> None:
    """A refit in buckets (one module each): no token is sampled between the first and the last, the version comes
    with the last, and the request in flight goes on with model b's weights; a version missing a module is refused."""
    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    model_a = load_policy(str(tiny_dirs["a"]))[0].eval()
    units = list(export_hf_units(model_b, spec_b))

    async def scenario() -> tuple:
        engine = engine_on(tiny_dirs["a"])
        gate = WorkerGate(engine, 5)
        task = asyncio.create_task(engine.generate(PROMPT, SamplingParams(200, temperature=0.0)))
        await (await gate.during(engine.stage_weights(units[0], version=3)))
        for unit in units[1:-1]:
            await engine.stage_weights(unit, version=3)
        held = engine.stats.generated_tokens
        await asyncio.sleep(0.3)
        frozen = (engine.stats.generated_tokens == held, engine.weight_version)
        with pytest.raises(EngineError, match="a bucket of version 4 while version 3's buckets are loading"):
            await engine.stage_weights(units[0], version=4)
        await engine.update_weights(units[-1], version=3)
        result = await task
        replica = dict(megatron_weights(engine._model))
        await engine.stage_weights(units[0], version=5)
        with pytest.raises(EngineError, match=r"version 5's buckets miss \["):
            await engine.update_weights(units[2], version=5)
        await engine.shutdown()
        return frozen, result, replica, engine.weight_version

    frozen, result, replica, version = asyncio.run(scenario())
    assert frozen == (True, 0) and version == 3
    assert all(torch.equal(replica[name], param) for name, param in megatron_weights(model_b))
    assert result.weight_version == 0 and len(result.token_ids) == 200
    on_a = follows_argmax(model_a, PROMPT, result.token_ids)
    on_b = follows_argmax(model_b.eval(), PROMPT, result.token_ids)
    assert [k for k in range(1, 200) if all(on_a[:k]) and all(on_b[k:])], "tokens of model a, then of model b"
    assert_versions_split_at_the_refit(result.token_versions, 0, 3, on_a, on_b)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_request_in_flight_at_stand_down_finishes_correctly_after_wake(tiny_dirs: dict, overlap: bool) -> None:
    ref = load_policy(str(tiny_dirs["a"]))[0].eval()
    sampled = SamplingParams(120, temperature=0.9, top_k=10, seed=11)

    async def scenario() -> tuple:
        engine = engine_on(tiny_dirs["a"], overlap=overlap)
        uninterrupted = await engine.generate(PROMPT, sampled)
        gate = WorkerGate(engine, 120 + 10)
        greedy = asyncio.create_task(engine.generate(PROMPT, SamplingParams(120, temperature=0.0)))
        seeded = asyncio.create_task(engine.generate(PROMPT, sampled))
        await (await gate.during(engine.stand_down()))
        assert engine.stood_down
        frozen = engine.stats.generated_tokens
        late = asyncio.create_task(engine.generate((3, 4), SamplingParams(5)))  # queued while stood down
        await asyncio.sleep(0.3)
        assert engine.stats.generated_tokens == frozen and not greedy.done() and not late.done()
        await engine.wake()
        results = await asyncio.gather(greedy, seeded, late)
        await engine.shutdown()
        return uninterrupted, frozen, *results

    uninterrupted, frozen, greedy, seeded, late = asyncio.run(scenario())
    assert 120 + 10 <= frozen < 120 + 240  # stood down mid-flight
    assert all(follows_argmax(ref, PROMPT, greedy.token_ids)) and len(greedy.token_ids) == 120
    assert seeded.token_ids == uninterrupted.token_ids  # re-prefill resumes the same draws
    with torch.no_grad():
        trainer = token_logprobs(ref, torch.tensor([PROMPT + seeded.token_ids]), temperature=0.9)[
            0, len(PROMPT) :
        ].cpu()
    assert torch.allclose(trainer, torch.tensor(seeded.logprobs), atol=1e-4)
    assert len(late.token_ids) == 5


def test_active_deadline_ignores_stood_down_time_and_expires_while_active(tiny_dirs: dict) -> None:
    async def scenario() -> None:
        engine = engine_on(tiny_dirs["a"])
        await engine.stand_down()
        expiring = asyncio.create_task(engine.active_wait_for(asyncio.Event().wait(), 0.3))
        queued = asyncio.create_task(engine.generate(PROMPT, SamplingParams(5)))
        await asyncio.sleep(0.8)  # stood down for longer than the deadline
        assert not expiring.done() and not queued.done()
        await engine.wake()
        assert len((await queued).token_ids) == 5
        with pytest.raises(TimeoutError):
            await expiring  # awake, its 0.3 s run out
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await engine.active_wait_for(asyncio.sleep(10), 0.2)
        assert 0.15 < time.monotonic() - start < 5.0
        with pytest.raises(TimeoutError):  # an expired deadline cancels the request; the engine drops it
            async with engine.active_deadline(0.01):
                await engine.generate(PROMPT, SamplingParams(240, temperature=0.0))
        assert len((await engine.generate(PROMPT, SamplingParams(3))).token_ids) == 3
        await engine.shutdown()

    asyncio.run(scenario())


def test_active_clock_counts_only_awake_time() -> None:
    async def scenario() -> None:
        clock = ActiveClock()
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            async with clock.deadline(1.0):
                await asyncio.sleep(0.2)  # 0.8 s to spare: a loaded machine's late wake-up does not reach it
                clock.pause()
                paused_at = clock.now()
                await asyncio.sleep(0.5)  # paused: the deadline (about 0.8 s left) must not fire
                assert clock.now() == paused_at and not clock.running
                clock.resume()
                await asyncio.sleep(10)
        elapsed = time.monotonic() - start
        assert 1.45 < elapsed < 5.0, elapsed  # 1.0 s awake + 0.5 s paused
        assert 0.95 < clock.now() < 4.5
        async with clock.deadline(None):
            await asyncio.sleep(0.01)
        assert await clock.wait_for(asyncio.sleep(0.01, result=7), 1.0) == 7

    asyncio.run(scenario())
