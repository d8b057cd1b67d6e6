"""Refit in bounded buckets: the packing rule, the controller's side (buckets staged, the version adopted with the
last, one deadline), and one process's refits through the strategy into a real engine."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning.pytorch import Callback

from sc_lightning.engines.base import EngineError
from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.models.megatron import megatron_weights
from sc_lightning.models.warm_start import resolve_model_name
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.trainer.refit_gather import bucket_units, stage_owners
from sc_lightning.types import SamplingParams
from tests.helpers.controllers import config, make
from tests.helpers.fits import tiny_config, tiny_trainer
from tests.helpers.held_bytes import HeldBytes
from tests.helpers.scripts import answer_correctly


def announced(sizes: list[list[int]]) -> list[tuple[int, object]]:
    """Units of one-byte-per-element tensors named ``u{i}.{j}``, announced with their sizes; each gather makes
    fresh tensors."""

    def gather(i: int, unit: list[int]):
        return lambda: [(f"u{i}.{j}", torch.zeros(n, dtype=torch.uint8)) for j, n in enumerate(unit)]

    return [(sum(unit), gather(i, unit)) for i, unit in enumerate(sizes)]


@settings(max_examples=300)
@given(
    sizes=st.lists(st.lists(st.integers(1, 64), min_size=1, max_size=3), max_size=25),
    bound=st.integers(1, 120),
)
def test_buckets_are_bounded_whole_units_covering_every_name_once(sizes: list[list[int]], bound: int) -> None:
    held = HeldBytes()
    units = [(size, held.watch(gather)) for size, gather in announced(sizes)]
    buckets = []
    for bucket, last in bucket_units(units, bound):
        buckets.append(([name for name, _ in bucket], sum(t.numel() for _, t in bucket), last))
        del bucket  # a pushed bucket is dropped before the next is gathered
    names = [name for bucket_names, _, _ in buckets for name in bucket_names]
    assert names == [f"u{i}.{j}" for i, unit in enumerate(sizes) for j in range(len(unit))]  # each once, in order
    assert [last for _, _, last in buckets] == [i == len(buckets) - 1 for i in range(len(buckets))]
    unit_of = {f"u{i}.{j}": i for i, unit in enumerate(sizes) for j in range(len(unit))}
    for bucket_names, size, _ in buckets:
        whole = {unit_of[name] for name in bucket_names}
        assert all(len(sizes[i]) == sum(unit_of[n] == i for n in bucket_names) for i in whole)  # units never split
        assert size <= bound or len(whole) == 1  # over the bound: one unit alone
    for (_, size, _), (next_names, _, _) in zip(buckets, buckets[1:], strict=False):
        assert size + sum(sizes[unit_of[next_names[0]]]) > bound  # greedy: the next unit did not fit
    largest = max((sum(unit) for unit in sizes), default=0)
    assert held.peak <= max(bound, largest)  # never more than one bucket (or one unit) at once


def test_a_name_two_stages_hold_is_sent_by_the_last() -> None:
    from tests.helpers.train_rows import SPEC

    tied = stage_owners(dataclasses.replace(SPEC, tie_word_embeddings=True), 2)
    assert tied["model.embed_tokens.weight"] == tied["lm_head.weight"] == 1  # the last stage's copy of the table
    assert (tied["model.layers.0.mlp.up_proj.weight"], tied["model.layers.1.mlp.up_proj.weight"]) == (0, 1)
    untied = stage_owners(SPEC, 2)
    assert (untied["model.embed_tokens.weight"], untied["lm_head.weight"], untied["model.norm.weight"]) == (0, 1, 1)
    assert set(stage_owners(SPEC, 1).values()) == {0}


# ---- the controller: buckets staged, the version adopted with the last, one deadline for all of them --------------


class SlowStagingEngine(ScriptedEngine):
    """FAKE engine: a ScriptedEngine whose refit calls each take ``delay_s``, recording (call, version, the version
    it served meanwhile)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(answer_correctly)
        self.delay_s = delay_s
        self.calls: list[tuple[str, int, int]] = []

    async def stage_weights(self, named_tensors: Iterable, version: int) -> None:
        await asyncio.sleep(self.delay_s)
        self.calls.append(("stage", version, self.weight_version))
        await super().stage_weights(named_tensors, version)

    async def update_weights(self, named_tensors: Iterable, version: int) -> None:
        await asyncio.sleep(self.delay_s)
        self.calls.append(("update", version, self.weight_version))
        await super().update_weights(named_tensors, version)


def test_buckets_are_staged_the_version_comes_with_the_last_and_one_deadline_holds_for_all() -> None:
    async def scenario() -> tuple:
        engine = SlowStagingEngine(delay_s=0.6)
        cfg = config({"name": "in_order", "max_lookahead_versions": 1}, buffered=4)
        # two buckets fit with 0.5 s to spare (a loaded machine's late timers), three do not
        generation = dataclasses.replace(cfg.policy.generation, refit_timeout_s=1.7)
        cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, generation=generation))
        controller = make(cfg, engine)
        await controller.start()
        await controller.begin_refit(1)
        await controller.push_weights([], 1, last=False)
        await controller.push_weights([], 1, last=True)
        served_before_finish = controller.manager.weight_version
        await controller.finish_refit(1)
        stamped = controller.manager.weight_version
        await controller.begin_refit(2)  # a new refit: a fresh deadline
        await controller.push_weights([], 2, last=False)
        await controller.push_weights([], 2, last=False)
        with pytest.raises(EngineError, match=r"version 2 did not finish within policy.generation.refit_timeout_s"):
            await controller.push_weights([], 2, last=True)
        await controller.shutdown()
        return engine.calls[:2], served_before_finish, stamped, engine.staged

    calls, served_before_finish, stamped, staged = asyncio.run(scenario())
    assert calls == [("stage", 1, 0), ("update", 1, 0)]  # the engine adopts 1 with the last bucket
    assert (served_before_finish, stamped) == (0, 1)  # rollouts are stamped 1 only once the refit finishes
    assert staged == [1, 2, 2]


# ---- one process: the strategy's refits, bucket by bucket, into a real engine that takes HF names ------------------

BOUND = 40_000  # bytes: the tiny policy (340 kB, largest unit 64 kB) takes a dozen buckets, some of one unit


class FakeHFOnlyEngine:
    """FAKE wrapper over a real MegatronEngine that takes HF-named weights only (as a Ray or vLLM engine does), so
    the strategy streams the policy to it; records every refit call: (call, version, tensor bytes, names, the
    version the engine served at the time)."""

    accepts_megatron_weights = False

    def __init__(self, engine: MegatronEngine) -> None:
        self.engine, self.name = engine, engine.name
        self.calls: list[tuple[str, int, int, list[str], int]] = []

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def _record(self, call: str, named_tensors: Iterable, version: int) -> list:
        named = list(named_tensors)
        size = sum(t.numel() * t.element_size() for _, t in named)
        self.calls.append((call, version, size, [n for n, _ in named], self.engine.weight_version))
        return named

    async def generate(self, prompt_token_ids, sampling: SamplingParams, **kwargs):
        return await self.engine.generate(prompt_token_ids, sampling, **kwargs)

    async def stage_weights(self, named_tensors: Iterable, version: int) -> None:
        await self.engine.stage_weights(self._record("stage", named_tensors, version), version)

    async def update_weights(self, named_tensors: Iterable, version: int) -> None:
        await self.engine.update_weights(self._record("update", named_tensors, version), version)

    async def stand_down(self) -> None:
        await self.engine.stand_down()

    async def wake(self) -> None:
        await self.engine.wake()

    async def shutdown(self) -> None:
        await self.engine.shutdown()


class EngineHoldsTheTrainersWeights(Callback):
    """After each step's refit: whether the engine's replica equals the trainer's policy, and its version."""

    def __init__(self) -> None:
        self.exact: list[bool] = []
        self.versions: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        engine = trainer.strategy.rollout_side.controller.controller.served.engine
        replica = dict(megatron_weights(engine.engine._model))
        self.exact.append(all(torch.equal(replica[name], p) for name, p in megatron_weights(pl_module.policy)))
        self.versions.append(engine.weight_version)


@pytest.mark.slow
def test_each_refit_streams_bounded_buckets_and_the_engine_ends_with_the_trainers_weights() -> None:
    built: list[FakeHFOnlyEngine] = []

    def engine_factory(config, weights):
        seed = config.algo.seed
        model_name = resolve_model_name(config.policy.model_name, seed=seed)
        built.append(FakeHFOnlyEngine(MegatronEngine.from_pretrained(model_name, seed=seed)))
        return built[-1]

    config = tiny_config("grpo.max_num_steps=2", f"policy.generation.refit_bucket_mb={BOUND / 2**20}")
    check = EngineHoldsTheTrainersWeights()
    trainer = tiny_trainer(config, engine_factory, [check])
    assert trainer.strategy.rollout_side.refit_bucket_bytes == BOUND  # the knob, in bytes
    trainer.fit(GRPOModule(config))
    assert check.exact == [True, True] and check.versions == [1, 2]
    calls = built[0].calls
    for version in (1, 2):
        refit = [call for call in calls if call[1] == version]
        assert [c[0] for c in refit] == ["stage"] * (len(refit) - 1) + ["update"] and len(refit) > 5
        assert all(served == version - 1 for *_, served in refit)  # the engine adopts the version with the last
        names = [name for call in refit for name in call[3]]
        assert len(names) == len(set(names)) == 2 * 12 + 3  # every tensor once (tiny: 2 layers, untied)
        over = [call[3] for call in refit if call[2] > BOUND]  # a layer's q/k/v, or its gate/up: one module alone
        assert over and all(len({(n.split(".")[2], "mlp" in n) for n in names}) == 1 for names in over)
