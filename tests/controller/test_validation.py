"""Validation beside the rollouts, through the SingleController with the real buffer, sampler, data plane, validation
set and environment: each validation is pinned to one weight version, bounded, and kept off the training path.

The engine is the FAKE ScriptedEngine (nothing here can sample a real model quickly); everything else is real.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sc_lightning.config import SCConfig, load_config
from sc_lightning.config.algorithm import GRPOConfig
from sc_lightning.controller.controller import SingleController
from sc_lightning.controller.validation import ValidationError, ValidationTimeout
from sc_lightning.rollout.datasets import ArithmeticDataset, ArithmeticValidationSet
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.types import Generation, SamplingParams
from tests.helpers.controllers import make
from tests.helpers.scripts import TOKENIZER, answer_correctly

N = 2  # groups per step


def val_config(**grpo: Any) -> SCConfig:
    """make()'s small GRPO config with validation knobs (every step by default, 2 requests at once)."""
    knobs = {"num_prompts_per_step": N, "num_generations_per_prompt": 2, "max_num_epochs": 1, "seed": 3}
    knobs |= {"val_period": 1, "val_batch_size": 2, "max_val_samples": 12, **grpo}
    return load_config(
        {
            "grpo": knobs,
            "policy": {"train_global_batch_size": 2 * N, "generation": {"max_new_tokens": 3}},
            "async_rl": {
                "sampler": {"name": "in_order", "max_lookahead_versions": 1},
                "rollout_failure": {"max_infra_attempts_per_prompt": 1, "max_data_attempts_per_prompt": 1},
            },
            "data_plane": {"backend": "memory"},
        }
    )


class CountingEngine(ScriptedEngine):
    """FAKE engine (a ScriptedEngine) that yields once per request and records the most validation requests in
    flight at once (validation requests are the ones whose prompt id the test marks by seed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.val_seeds: set[int] = set()
        self.val_inflight = 0
        self.max_val_inflight = 0
        self.val_inflight_at_update: list[int] = []

    async def generate(self, prompt_token_ids: tuple[int, ...], sampling: SamplingParams) -> Generation:
        """The scripted completion, after one turn of the loop (so requests overlap)."""
        counted = sampling.seed in self.val_seeds
        self.val_inflight += counted
        self.max_val_inflight = max(self.max_val_inflight, self.val_inflight)
        try:
            await asyncio.sleep(0)  # a turn of the loop, as a real engine's request takes: not a synchronisation
            return await super().generate(prompt_token_ids, sampling)
        finally:
            self.val_inflight -= counted

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        """Record how many validation requests were generating when the weights changed."""
        self.val_inflight_at_update.append(self.val_inflight)
        await super().update_weights(named_tensors, version)


def mark_validation_seeds(controller: SingleController, engine: CountingEngine) -> None:
    validator = controller.validator
    assert validator is not None
    engine.val_seeds = {validator.settings.answering.sampling_for(prompt).seed for prompt in validator.prompts}


async def train(controller: SingleController, steps: int) -> None:
    """Act as the train pump: select a step's groups, then refit at once (while the validation still runs)."""
    for version in range(steps):
        chosen = await controller.select(version, N, N, timeout_s=30)
        assert chosen, f"step {version}: no groups"
        await controller.begin_refit(version + 1)
        await controller.push_weights([], version + 1)
        await controller.finish_refit(version + 1)


def test_each_validation_is_pinned_to_its_step_and_bounded() -> None:
    """A refit right after the validation of its step started waits for it: every validation completion has the
    step's version, no validation request is generating when weights change, and at most val_batch_size run."""

    async def scenario() -> tuple[list, CountingEngine]:
        engine = CountingEngine(answer_correctly)
        controller = make(val_config(), engine, dataset_size=8)
        mark_validation_seeds(controller, engine)
        await controller.start()
        await train(controller, 3)
        results = await controller.settle_validation()
        await controller.shutdown()
        return results, engine

    results, engine = asyncio.run(scenario())
    assert [r.step for r in results] == [1, 2, 3]  # period 1: each refit's version (0 needs val_at_start)
    for result in results:
        assert set(result.generation_versions) == {result.step} == {result.weight_version}
        assert len(result.rewards) == 12 and result.metrics()["val/accuracy"] == 1.0
    assert engine.val_inflight_at_update == [0, 0, 0]
    assert 1 <= engine.max_val_inflight <= 2


def test_validation_stays_off_the_training_path() -> None:
    """Validation prompts never come from the training stream and never reach the buffer or the ledger."""

    async def scenario() -> list[str]:
        engine = CountingEngine(answer_correctly)
        controller = make(val_config(val_period=0, val_at_start=True), engine, dataset_size=8)
        await controller.start()
        await controller.validate(0)
        await controller.settle_validation()
        slots = [slot.prompt_id for slot in controller.buffer.slots]
        await controller.shutdown()
        return slots

    slots = asyncio.run(scenario())
    training_ids = {prompt.prompt_id for prompt in ArithmeticDataset(8, 0, TOKENIZER)}
    assert slots and set(slots) <= training_ids


def test_a_validation_past_its_deadline_stops_the_refit_naming_step_and_engine() -> None:
    async def scenario() -> None:
        engine = ScriptedEngine(answer_correctly, gated=True)  # nothing is released: the validation hangs
        controller = make(val_config(val_at_start=True, val_timeout_s=0.2), engine, dataset_size=8)
        await controller.start()
        await controller.validate(0)
        try:
            await controller.begin_refit(1)
        finally:
            engine.release_all()
            await controller.shutdown()

    with pytest.raises(ValidationTimeout, match=r"step 0: the validation on engine 'scripted'.*val_timeout_s=0.2"):
        asyncio.run(scenario())


def test_the_due_steps_follow_period_start_and_end() -> None:
    algo = GRPOConfig(val_period=10, val_at_start=True, val_at_end=True, max_num_steps=25)
    assert [s for s in range(26) if algo.validation_due(s, last_step=25)] == [0, 10, 20, 25]
    assert [s for s in range(26) if GRPOConfig(val_period=10).validation_due(s, last_step=25)] == [10, 20]


def test_the_arithmetic_validation_set_is_every_problem_once_with_its_own_ids() -> None:
    prompts = list(ArithmeticValidationSet(TOKENIZER))
    assert len({p.text for p in prompts}) == len(prompts) == 100
    assert not {p.prompt_id for p in prompts} & {p.prompt_id for p in ArithmeticDataset(512, 7, TOKENIZER)}


def test_a_failing_validation_request_stops_the_refit_naming_step_and_engine() -> None:
    async def scenario() -> None:
        engine = ScriptedEngine(answer_correctly, fail_on=0)  # the first request, a validation one, fails
        controller = make(val_config(val_at_start=True), engine, dataset_size=8)
        await controller.validate(0)  # before the pump starts: the validation asks first
        await controller.start()
        try:
            await controller.begin_refit(1)
        finally:
            await controller.shutdown()

    failed = r"step 0: the validation failed: answering prompt \S+ on engine 'scripted' failed: EngineError"
    with pytest.raises(ValidationError, match=failed):
        asyncio.run(scenario())
