"""The rollout side's distillation teachers: each one built where its config says (in this process, or a Ray actor),
and every dataset prompt's route checked, before anything generates (docs/distillation.md)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from sc_lightning.config import SCConfig
from sc_lightning.models.warm_start import resolve_model_name
from sc_lightning.rollout.teachers import TeacherScorer, TeacherScoring, check_routes
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import Prompt


def build_teacher_scoring(
    config: SCConfig, tokenizer: Tokenizer, dataset: Iterable[Prompt], *, device: torch.device
) -> TeacherScoring | None:
    """The teachers of a distillation run (None for any other run), after routing every prompt of ``dataset``: an
    UnroutedPromptError names the first row without a known teacher, a TeacherMismatchError the first teacher whose
    tokenizer is not the policy's. A colocated teacher lives on ``device`` (the trainer's)."""
    block = config.on_policy_distillation
    if block is None or not config.distills:
        return None
    check_routes(dataset, block)
    scorers: dict[str, TeacherScorer] = {}
    for alias in block.aliases():
        teacher = block.teachers[alias]
        model_name = resolve_model_name(teacher.model_name, seed=config.algo.seed)
        options = {
            "policy_tokenizer": tokenizer,
            "precision": teacher.precision,
            "seed": config.algo.seed,
            "full_vocabulary": block.full_vocabulary,
            "max_full_vocabulary_size": block.max_full_vocabulary_size,
            "max_batch_rows": teacher.max_batch_rows,
        }
        if teacher.colocated:
            from sc_lightning.models.teacher import TeacherModel

            scorers[alias] = TeacherModel(alias, model_name, device=device, **options)
        else:
            from sc_lightning.engines.factory import start_ray
            from sc_lightning.engines.teacher_actor import RayTeacher

            start_ray()
            scorers[alias] = RayTeacher(
                alias, model_name, num_cpus=teacher.num_cpus, num_gpus=teacher.num_gpus, **options
            )
    return TeacherScoring(block, scorers, temperature=config.policy.generation.temperature)
