"""A controller over the unshuffled 16-prompt arithmetic dataset, its prompts failing to score on demand, and a
train pump that lets a step close short (drop budgets, shrinking steps, the replacement reserve).

Prompts are not shuffled, so step k of n prompts holds dataset prompts k*n .. k*n+n-1 (before any reserve diverts a
batch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from sc_lightning.config import SCConfig, load_config
from sc_lightning.controller.api import ControllerStats, GroupMeta
from sc_lightning.controller.build import build_controller
from sc_lightning.controller.controller import SingleController
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.datasets import ArithmeticDataset
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.rollout.envs.base import RewardError
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.scripts import TOKENIZER, answer_correctly

DATASET = ArithmeticDataset(16, 0, TOKENIZER)


def prompt_id(index: int) -> str:
    """The id of dataset prompt ``index``."""
    return DATASET[index].prompt_id


def drop_config(*, n: int, lookahead: int = 0, **failure: object) -> SCConfig:
    """In-order GRPO, n prompts x 2 generations per step, unshuffled, 2 data / 2 infra attempts per prompt."""
    return load_config(
        {
            "grpo": {"num_prompts_per_step": n, "num_generations_per_prompt": 2, "max_num_epochs": 1, "seed": 3},
            "policy": {"train_global_batch_size": 2 * n, "generation": {"max_new_tokens": 3}},
            "data": {"shuffle": False},
            "async_rl": {
                "sampler": {"name": "in_order", "max_lookahead_versions": lookahead},
                "rollout_failure": {
                    "max_infra_attempts_per_prompt": 2,
                    "max_data_attempts_per_prompt": 2,
                    "backoff_base_s": 0.001,
                    **failure,
                },
            },
            "data_plane": {"backend": "memory"},
        }
    )


class FailingPrompts(ArithmeticEnvironment):
    """The arithmetic verifier, raising (a data failure) for every completion of the given prompts."""

    def __init__(self, bad: Collection[int]) -> None:
        super().__init__()
        self.bad = {prompt_id(i) for i in bad}

    def score(self, prompt, completion_text):
        """Raise for a bad prompt, else verify."""
        if prompt.prompt_id in self.bad:
            raise RewardError(f"prompt {prompt.prompt_id}: injected failure")
        return super().score(prompt, completion_text)


def make(cfg: SCConfig, *, engine: ScriptedEngine | None = None, bad_data: Collection[int] = ()) -> SingleController:
    """A controller over the unshuffled 16-prompt dataset."""
    return build_controller(
        cfg,
        data_plane=MemoryDataPlane(),
        engine=engine or ScriptedEngine(answer_correctly),
        environment=FailingPrompts(bad_data),
        tokenizer=TOKENIZER,
        dataset=DATASET,
    )


async def train(
    controller: SingleController, steps: int, n: int, *, first: int = 0
) -> tuple[list[list[str]], list[ControllerStats]]:
    """Act as the train pump from step ``first``: select until the step is full or closed short, refit; prompt ids
    and stats per step."""
    trained, stats = [], []
    for version in range(first, first + steps):
        step: list[GroupMeta] = []
        while len(step) < n:
            chunk = await controller.select(version, 1, n - len(step), timeout_s=30)
            assert chunk is not None, f"rollouts ran out during step {version}"
            if not chunk:
                break  # closed short
            step += chunk
        trained.append(sorted(group.prompt_id for group in step))
        await controller.begin_refit(version + 1)
        await controller.finish_refit(version + 1)
        stats.append(controller.stats())
    return trained, stats


def run(controller: SingleController, steps: int, n: int) -> tuple[list[list[str]], list[ControllerStats]]:
    """Start the controller, train ``steps`` steps, shut it down."""

    async def scenario():
        await controller.start()
        try:
            return await train(controller, steps, n)
        finally:
            await controller.shutdown()

    return asyncio.run(scenario())
