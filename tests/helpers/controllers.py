"""SingleController over the FAKE ScriptedEngine and the real buffer, samplers, data plane, dataset and environment:
a small config, the builder, and a train pump."""

from __future__ import annotations

from sc_lightning.config import SCConfig, load_config
from sc_lightning.controller.build import build_controller
from sc_lightning.controller.controller import SingleController
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.datasets import ArithmeticDataset
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.scripts import TOKENIZER


def config(
    sampler: dict,
    *,
    n: int = 2,
    buffered: int | None = None,
    min_groups: int | None = None,
    failure: dict | None = None,
    runtime: dict | None = None,
) -> SCConfig:
    """A small GRPO config: n prompts x 2 generations per step over the arithmetic task (``failure``: the
    async_rl.rollout_failure knobs; by default no retries, so an injected failure surfaces at once; ``runtime``:
    more async_rl knobs)."""
    return load_config(
        {
            "grpo": {"num_prompts_per_step": n, "num_generations_per_prompt": 2, "max_num_epochs": 1, "seed": 3},
            "policy": {"train_global_batch_size": 2 * n, "generation": {"max_new_tokens": 3}},
            "async_rl": {
                "sampler": sampler,
                "max_buffered_rollouts": buffered,
                "min_groups_for_streaming_train": min_groups,
                "rollout_failure": failure or {"max_infra_attempts_per_prompt": 1, "max_data_attempts_per_prompt": 1},
                **(runtime or {}),
            },
            "data_plane": {"backend": "memory"},
        }
    )


def make(cfg: SCConfig, engine: ScriptedEngine, dataset_size: int = 8) -> SingleController:
    """A controller of ``cfg`` over ``engine`` and an arithmetic dataset of ``dataset_size`` prompts."""
    return build_controller(
        cfg,
        data_plane=MemoryDataPlane(),
        engine=engine,
        environment=ArithmeticEnvironment(),
        tokenizer=TOKENIZER,
        dataset=ArithmeticDataset(dataset_size, 0, TOKENIZER),
    )


async def train_steps(controller: SingleController, steps: int, n: int, min_groups: int) -> list[list]:
    """Act as the train pump: per step, select chunks until n groups, clear them, refit."""
    trained = []
    for version in range(steps):
        step = []
        while len(step) < n:
            chunk = await controller.select(version, min(min_groups, n - len(step)), n - len(step), timeout_s=30)
            assert chunk is not None, f"rollouts ran out during step {version}"
            step.extend(chunk)
        trained.append(step)
        await controller.begin_refit(version + 1)
        await controller.finish_refit(version + 1)
    return trained
