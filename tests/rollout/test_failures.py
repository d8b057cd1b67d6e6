"""Failure taxonomy and retry budgets: classification, back-off, and retries through a real controller."""

from __future__ import annotations

import asyncio

import pytest

from sc_lightning.controller.api import RolloutPumpError
from sc_lightning.engines.base import EngineError
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.rollout.envs.base import RewardError
from sc_lightning.rollout.failures import RetryBudget, classify
from sc_lightning.rollout.manager import RolloutError, RolloutTimeout
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.controllers import config, make
from tests.helpers.scripts import answer_correctly


class HTTPFailure(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def wrapped(cause: BaseException) -> RolloutError:
    try:
        raise RolloutError("attempt failed", prompt_id="p", group_id="g", engine="e") from cause
    except RolloutError as exc:
        return exc


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (EngineError("engine 'a' is gone"), "infra"),
        (RolloutTimeout("too slow", prompt_id="p", group_id="g", engine="e"), "infra"),
        (TimeoutError(), "infra"),
        (ConnectionResetError(), "infra"),
        (HTTPFailure(503), "infra"),
        (HTTPFailure(429), "infra"),
        (HTTPFailure(408), "infra"),
        (HTTPFailure(400), "data"),
        (RewardError("bad answer"), "data"),
        (ValueError("unknown"), "data"),  # unrecognised: data, so it fails loudly
    ],
)
def test_classification_follows_the_cause_chain(failure: BaseException, kind: str) -> None:
    assert classify(failure) == kind
    assert classify(wrapped(failure)) == kind


def test_a_cause_cycle_ends_as_data() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert classify(a) == "data"


def test_budgets_are_per_kind_and_back_off_exponentially_to_the_cap() -> None:
    budget = RetryBudget(max_infra_attempts=4, max_data_attempts=2, backoff_base_s=0.5, max_backoff_s=1.5)
    assert budget.record("infra") and budget.backoff_s("infra") == 0.5
    assert budget.record("infra") and budget.backoff_s("infra") == 1.0
    assert budget.record("data") and budget.backoff_s("data") == 0.0
    assert budget.record("infra") and budget.backoff_s("infra") == 1.5  # 2.0 capped
    assert not budget.record("infra")  # the 4th infra failure spends the budget
    assert not budget.record("data") and budget.attempts == 6


FAST = {"max_infra_attempts_per_prompt": 3, "max_data_attempts_per_prompt": 2, "backoff_base_s": 0.01}


def test_an_infra_failure_is_retried_and_the_group_commits() -> None:
    async def scenario():
        engine = ScriptedEngine(answer_correctly, fail_on=1)  # the second generation request fails once
        controller = make(config({"name": "in_order", "max_lookahead_versions": 0}, failure=FAST), engine)
        await controller.start()
        chunk = await controller.select(0, 2, 2, timeout_s=30)
        stats = controller.stats()
        await controller.shutdown()
        return chunk, stats

    chunk, stats = asyncio.run(scenario())
    assert len(chunk) == 2 and stats.committed == 2
    assert (stats.infra_failures, stats.data_failures, stats.redispatched) == (1, 0, 1)


class FailingFirst(ArithmeticEnvironment):
    """The arithmetic verifier, raising on its first ``n`` calls."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def score(self, prompt, text):
        if self.left > 0:
            self.left -= 1
            raise RewardError(f"prompt {prompt.prompt_id}: injected failure")
        return super().score(prompt, text)


def run_with_environment(environment: ArithmeticEnvironment):
    async def scenario():
        controller = make(
            config({"name": "in_order", "max_lookahead_versions": 0}, n=1, failure=FAST),
            ScriptedEngine(answer_correctly),
        )
        controller.manager.environment = environment
        await controller.start()
        try:
            return await controller.select(0, 1, 1, timeout_s=30), controller.stats()
        finally:
            await controller.shutdown()

    return asyncio.run(scenario())


def test_a_data_failure_is_retried_at_once_within_its_budget() -> None:
    chunk, stats = run_with_environment(FailingFirst(1))
    assert len(chunk) == 1
    assert (stats.infra_failures, stats.data_failures, stats.redispatched) == (0, 1, 1)


def test_a_spent_budget_fails_the_run_naming_the_prompt_and_the_attempts() -> None:
    with pytest.raises(RolloutPumpError, match=r"prompt arithmetic-\d+ .*injected failure") as failure:
        run_with_environment(FailingFirst(10))
    notes = getattr(failure.value.__cause__, "__notes__", [])
    assert notes == ["gave up after 2 attempts (0 infra, 2 data)"]


def test_a_hung_engine_hits_the_group_deadline() -> None:
    """The engine never answers (gated, never released): rollout_timeout_s fires, naming the prompt."""

    async def scenario():
        failure = {**FAST, "generation_timeout_s": None, "rollout_timeout_s": 0.2}
        controller = make(
            config({"name": "in_order", "max_lookahead_versions": 0}, failure=failure), ScriptedEngine(gated=True)
        )
        await controller.start()
        try:
            await controller.select(0, 2, 2, timeout_s=30)
        finally:
            await controller.shutdown()

    with pytest.raises(RolloutPumpError, match=r"prompt arithmetic-\d+ .*exceeded rollout_timeout_s=0.2"):
        asyncio.run(scenario())


def watched(action: str):
    from sc_lightning.controller.watchdog import StallWatchdog

    async def scenario():
        controller = make(config({"name": "in_order", "max_lookahead_versions": 0}), ScriptedEngine(gated=True))
        watchdog = StallWatchdog(interval_s=0.02, stall_timeout_s=0.1, action=action)
        controller.add_background_task("stall watchdog", watchdog.run)
        await controller.start()
        try:
            if action == "abort":
                await controller.select(0, 2, 2, timeout_s=30)  # woken by the watchdog's failure
            else:
                with pytest.raises(Exception, match="waited past the deadline"):
                    await controller.select(0, 2, 2, timeout_s=0.5)  # the run goes on: only the select deadline
            return watchdog
        finally:
            await controller.shutdown()

    return asyncio.run(scenario())


def test_the_stall_watchdog_aborts_naming_where_the_run_stands() -> None:
    with pytest.raises(
        RolloutPumpError, match=r"^stall watchdog failed: no prompt group committed .* 2 group\(s\) in flight"
    ):
        watched("abort")


def test_in_warn_mode_the_stall_watchdog_warns_once_per_stall(caplog) -> None:
    with caplog.at_level("WARNING", logger="sc_lightning.controller.watchdog"):
        watchdog = watched("warn")
    assert watchdog.warnings == 1 and "stall: no prompt group committed" in caplog.text


class NaNOnce(ArithmeticEnvironment):
    """The arithmetic verifier, returning NaN for its very first completion."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def score(self, prompt, text):
        self.calls += 1
        return float("nan") if self.calls == 1 else super().score(prompt, text)


def test_a_non_finite_reward_is_a_data_failure_and_never_trained() -> None:
    chunk, stats = run_with_environment(NaNOnce())
    assert len(chunk) == 1 and stats.data_failures == 1 and stats.redispatched == 1
    assert stats.committed == 1  # only the retried, finite group
