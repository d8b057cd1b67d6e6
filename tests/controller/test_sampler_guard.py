"""A custom sampler that raises or returns the wrong shape: the error names it and the call; nothing is lost.

The engine is the FAKE ScriptedEngine; the controller, buffer, data plane and samplers are real.
"""

from __future__ import annotations

import asyncio

import pytest

from sc_lightning.controller.api import RolloutPumpError
from sc_lightning.controller.sampler_guard import CustomSamplerFailure
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.controllers import config, make, train_steps
from tests.helpers.scripts import answer_correctly


def custom(name: str, **init_args: object) -> dict:
    """A custom sampler block for a class of tests/controller/custom.py."""
    return {"name": "custom", "target": f"tests.controller.custom:{name}", "init_args": init_args}


def test_a_raising_select_names_the_sampler_and_the_call_and_keeps_the_groups() -> None:
    async def scenario():
        controller = make(config(custom("RaisesInSelect", from_step=1)), ScriptedEngine(answer_correctly))
        await controller.start()
        await train_steps(controller, 1, n=2, min_groups=2)
        await controller.wait_until(lambda: controller.stats().committed == 4, timeout_s=30)
        with pytest.raises(CustomSamplerFailure) as failure:
            await controller.select(1, 2, 2, timeout_s=30)
        state = controller.checkpoint_state()
        await controller.shutdown()
        return failure.value, state

    failure, state = asyncio.run(scenario())
    assert str(failure) == (
        "custom sampler tests.controller.custom:RaisesInSelect (async_rl.sampler.target): "
        "select(trainer_version=1, min_groups=2, max_groups=2) raised KeyError: 'no such slot'"
    )
    assert isinstance(failure.__cause__, KeyError)
    # step 1's two committed groups are still in the buffer: a checkpoint taken now keeps them
    assert [g["target_step"] for g in state["replay_index"]["groups"]] == [1, 1]


def test_a_raising_admit_stops_the_pump_naming_the_sampler() -> None:
    async def scenario():
        controller = make(config(custom("RaisesInAdmit", gate_window=0)), ScriptedEngine(answer_correctly))
        await controller.start()
        await train_steps(controller, 1, n=2, min_groups=2)
        await controller.select(1, 2, 2, timeout_s=30)

    with pytest.raises(RolloutPumpError, match=r"RaisesInAdmit .*: admit\(\) raised ZeroDivisionError"):
        asyncio.run(scenario())


def test_a_select_returning_more_than_asked_is_an_error() -> None:
    async def scenario():
        controller = make(
            config(custom("SelectsTooMany", gate_window=0), min_groups=1), ScriptedEngine(answer_correctly)
        )
        await controller.start()
        await controller.wait_until(lambda: controller.stats().committed == 2, timeout_s=30)
        try:
            await controller.select(0, 1, 1, timeout_s=30)
        finally:
            await controller.shutdown()

    with pytest.raises(
        CustomSamplerFailure, match=r"select\(trainer_version=0, min_groups=1, max_groups=1\) returned 2"
    ):
        asyncio.run(scenario())
