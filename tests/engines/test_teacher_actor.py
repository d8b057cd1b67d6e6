"""A distillation teacher on a Ray actor of its own (``colocated: false``), on the tests' shared Ray cluster: built by
the rollout side's composition from the knob, it scores rows exactly as the same teacher in this process does, and
once its actor is killed, scoring fails as an infrastructure failure naming the teacher, retried within the rollout
failure budget and then given up on.

Everything is real but the generation engine (the FAKE ScriptedEngine: the teacher scores its completions).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from sc_lightning.config import SCConfig, load_config
from sc_lightning.controller.build import build_controller
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.engines.teacher_actor import RayTeacher
from sc_lightning.models.teacher import TeacherModel
from sc_lightning.rollout.datasets import ArithmeticDataset
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.rollout.failures import classify
from sc_lightning.rollout.teachers import TeacherError, TeacherScoring
from sc_lightning.rollout_side.teachers import build_teacher_scoring
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.types import Generation, ScoredGroup
from tests.helpers.actors import kill_and_wait
from tests.helpers.scripts import TOKENIZER, answer_correctly

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("model_parallel")]

SEED = 5


def actor_teacher_config() -> SCConfig:
    """An opd config whose one teacher, ``add``, runs on a Ray actor; no retry back-off to speak of, 2 infra tries."""
    return load_config(
        {
            "grpo": {
                "num_prompts_per_step": 2,
                "num_generations_per_prompt": 2,
                "seed": SEED,
                "adv_estimator": {"name": "opd"},
            },
            "on_policy_distillation": {
                "teachers": {"add": {"model_name": "builtin:tiny", "colocated": False, "num_cpus": 1}},
                "default_teacher": "add",
            },
            "policy": {"train_global_batch_size": 4, "generation": {"max_new_tokens": 3}},
            "async_rl": {
                "rollout_failure": {
                    "max_infra_attempts_per_prompt": 2,
                    "max_data_attempts_per_prompt": 1,
                    "backoff_base_s": 0.01,
                    "max_backoff_s": 0.01,
                }
            },
            "data_plane": {"backend": "memory"},
        }
    )


def scored_group(dataset: ArithmeticDataset) -> ScoredGroup:
    """Two completions of the dataset's first prompt, of different lengths."""
    first, second = (TOKENIZER.encode(text) for text in ("12", "7"))
    generations = (
        Generation((*first, TOKENIZER.EOS), (-0.3, -0.2, -0.1), "stop", 0),
        Generation(tuple(second), (-0.4,), "stop", 0),
    )
    return ScoredGroup(dataset[0], generations, (0.0, 1.0))


def test_the_actor_teacher_scores_as_the_in_process_one_and_its_death_is_retried_then_named(
    ray_cluster: None,
) -> None:
    config = actor_teacher_config()
    block = config.on_policy_distillation
    assert block is not None
    dataset = ArithmeticDataset(4, 0, TOKENIZER)
    actor_scoring = build_teacher_scoring(config, TOKENIZER, dataset, device=torch.device("cpu"))
    assert actor_scoring is not None and isinstance(actor_scoring.scorers["add"], RayTeacher)
    local = TeacherModel("add", "builtin:tiny", policy_tokenizer=TOKENIZER, seed=SEED)
    local_scoring = TeacherScoring(block, {"add": local})
    group = scored_group(dataset)

    async def scenario() -> None:
        remote, here = await actor_scoring(group, "g0"), await local_scoring(group, "g0")
        assert remote.teacher is not None and here.teacher is not None
        assert remote.teacher.alias == here.teacher.alias == "add"
        for actor_row, local_row in zip(remote.teacher.logprobs, here.teacher.logprobs, strict=True):
            assert (actor_row[len(group.prompt.token_ids) :] < 0).all()  # the model tokens were scored
            torch.testing.assert_close(actor_row, local_row, rtol=0, atol=1e-5)

        kill_and_wait(actor_scoring.scorers["add"].actor)
        with pytest.raises(TeacherError, match=r"prompt .* \(group g1, engine teacher add\): ActorDiedError") as died:
            await actor_scoring(group, "g1")
        assert classify(died.value) == "infra"

        # in a rollout: the dead teacher's failure is retried as an engine's infra failure, then given up on
        controller = build_controller(
            config,
            data_plane=MemoryDataPlane(),
            engine=ScriptedEngine(answer_correctly),
            environment=ArithmeticEnvironment(),
            tokenizer=TOKENIZER,
            dataset=dataset,
            teachers=actor_scoring,
        )
        manager = controller.manager
        with pytest.raises(TeacherError, match=r"engine teacher add\): ActorDiedError") as gave_up:
            await manager.generate_and_push(dataset[1])
        assert "gave up after 2 attempts (2 infra, 0 data)" in gave_up.value.__notes__
        assert (manager.failures["infra"], manager.failures["redispatched"]) == (2, 1)
        await actor_scoring.shutdown()

    asyncio.run(scenario())


def test_a_teacher_ray_cannot_place_fails_naming_it_within_its_startup_deadline(ray_cluster: None) -> None:
    """An actor asking for more CPUs than the cluster has stays pending forever: the wait for its load ends at
    ``startup_timeout_s`` with an EngineError naming the teacher and what it asked for, and its actor is killed."""
    from sc_lightning.engines.base import EngineError

    started = time.monotonic()
    with pytest.raises(EngineError, match=r"teacher 'big' \(builtin:tiny\) was not loaded within 2 s: .* 4096 CPU"):
        RayTeacher("big", "builtin:tiny", num_cpus=4096, num_gpus=0, startup_timeout_s=2.0, seed=SEED)
    assert time.monotonic() - started < 30
