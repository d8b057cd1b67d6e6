"""The throughput benchmark's environment: seeded long-tailed answer lengths, eos ignored, set on every request."""

from __future__ import annotations

import asyncio
import statistics

from sc_lightning.config.runtime import EnvConfig
from sc_lightning.rollout.envs import FixedLengthEnvironment, build_environment, request_sampling
from sc_lightning.rollout.envs.fixed_length import answer_length
from sc_lightning.rollout.manager import RolloutManager, RolloutSettings, ServedPolicy
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import Prompt, SamplingParams, ScoredGroup


def test_answer_lengths_are_long_tailed_around_a_quarter_of_the_cap_and_seeded() -> None:
    lengths = [answer_length(seed, 4096) for seed in range(4000)]
    assert 900 <= statistics.mean(lengths) <= 1150  # mean ~1K: a quarter of the cap
    assert statistics.median(lengths) < 800  # long-tailed: the median well below the mean
    assert min(lengths) == 64 and max(lengths) == 4096  # clipped to [cap / 64, cap]
    assert 0.005 <= lengths.count(4096) / len(lengths) <= 0.04  # a tail at the cap: ~2%
    assert [answer_length(seed, 4096) for seed in range(4000)] == lengths  # the seed fixes the length
    assert all(1 <= answer_length(seed, 8) <= 8 for seed in range(100))  # any cap


def test_each_request_gets_its_drawn_length_and_ignores_eos() -> None:
    environment = build_environment(EnvConfig(name="fixed_length"))
    assert isinstance(environment, FixedLengthEnvironment)
    shape = request_sampling(environment)
    assert shape is not None
    run = SamplingParams(max_new_tokens=4096, temperature=0.7, seed=11)
    request = shape(Prompt("p", (2,)), run)
    assert request == SamplingParams(answer_length(11, 4096), temperature=0.7, seed=11, ignore_eos=True)
    assert request_sampling(object()) is None  # other environments leave the run's sampling as it is


class _Sink:
    """Hands the scored group back (a manager's buffer is not what this test checks)."""

    def reserve(self, *, prompt_id: str, weight_version: int, target_step: int | None) -> str:
        return f"{prompt_id}-g"

    async def commit(self, group_id: str, group: ScoredGroup, *, start_weight: int, end_weight: int) -> ScoredGroup:
        return group

    def discard_if_present(self, group_id: str) -> None:
        pass


def test_the_rollout_manager_samples_each_completion_as_the_environment_says() -> None:
    engine = ScriptedEngine(lambda prompt, call: (5,) * 1000)  # would answer 1000 tokens: the request cuts it
    settings = RolloutSettings(16, SamplingParams(max_new_tokens=256), generation_timeout_s=None, env_timeout_s=None)
    manager = RolloutManager(ServedPolicy(engine), FixedLengthEnvironment(), CharTokenizer(), _Sink(), settings)
    group = asyncio.run(manager.generate_and_push(Prompt("p-1", (2, 3))))
    lengths = [len(g.token_ids) for g in group.generations]
    assert all(4 <= n <= 256 for n in lengths) and len(set(lengths)) > 8, lengths  # drawn, not the run's 256
    assert list(group.rewards) == [n / 4096 for n in lengths]  # the reward: the answer's length over 4096
