"""The windowed sampler's ``over_sampling_ratio`` through the SingleController: the waste it saves, measured by the
engine goodput's wasted-token counter (evicted, aborted or failed groups' completion tokens).

The engine is the FAKE ScriptedEngine (instant completions: an engine much faster than the trainer, the case where
uncapped dispatch over-produces most); everything else is real.
"""

from __future__ import annotations

import asyncio

from sc_lightning.controller.api import ControllerStats
from sc_lightning.controller.controller import SingleController
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.controllers import config, make
from tests.helpers.scripts import answer_correctly


def pump_idle(controller: SingleController) -> bool:
    """The pump can dispatch nothing more: nothing generating, and the sampler's cap or the buffer permits bind."""
    capped = not controller.sampler.can_admit(controller.trainer_version)
    full = controller.admission.buffer_permits.held == controller.admission.buffer_permits.total
    return controller.admission.gate.generating == 0 and (capped or full)


def run_windowed(ratio: float | None, steps: int = 4) -> ControllerStats:
    """windowed with no staleness allowed, one group per step, a 4-group buffer: each step's refit comes once the
    pump can dispatch nothing more. The controller's counters at the end (the engine's goodput among them)."""

    async def scenario() -> ControllerStats:
        sampler = {"name": "windowed", "max_staleness_versions": 0, "over_sampling_ratio": ratio}
        controller = make(config(sampler, n=1, buffered=4, min_groups=1), ScriptedEngine(answer_correctly), 32)
        await controller.start()
        for version in range(steps):
            assert await controller.select(version, 1, 1, timeout_s=30)
            await controller.wait_until(lambda: pump_idle(controller), timeout_s=30)
            await controller.begin_refit(version + 1)
            await controller.finish_refit(version + 1)
        stats = controller.stats()
        await controller.shutdown()
        return stats

    return asyncio.run(scenario())


def test_over_sampling_ratio_cuts_the_tokens_generated_only_to_be_evicted() -> None:
    """Uncapped, the pump keeps the buffer full of groups of the current weight, and the next step evicts them all
    (4 groups a step after the first); a ratio of 2 lets one batch run ahead of the first step, evicted once; 1
    generates only what is trained."""
    runs = [run_windowed(ratio) for ratio in (None, 2.0, 1.0)]
    assert [(stats.selected, stats.evicted, stats.aborted) for stats in runs] == [(4, 12, 0), (4, 1, 0), (4, 0, 0)]
    uncapped, capped_2, capped_1 = (stats.engine_time for stats in runs)
    assert uncapped.wasted_tokens > capped_2.wasted_tokens > capped_1.wasted_tokens == 0
    assert capped_1.trained_tokens > 0
