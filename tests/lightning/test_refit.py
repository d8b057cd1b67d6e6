"""Refit: after every RL step the engine holds exactly the trainer's new weights."""

from __future__ import annotations

import torch
from lightning.pytorch import Callback

from sc_lightning.engines.megatron import MegatronEngine
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.models import token_logprobs
from sc_lightning.models.warm_start import resolve_model_name
from sc_lightning.types import SamplingParams
from tests.conftest import tiny_trainer
from tests.lightning.test_train_pump import tiny_config

PROMPT = (2, 8, 13, 9, 16)  # "<s>5+6="


def engine_factory(config, weights):
    seed = config.algo.seed
    return MegatronEngine.from_pretrained(resolve_model_name(config.policy.model_name, seed=seed), seed=seed)


class EngineMatchesTrainer(Callback):
    """After the refit of each step: the engine's greedy completion and its logprobs equal the trainer's."""

    def __init__(self) -> None:
        self.versions: list[int] = []
        self.max_error: float = 0.0
        self.stood_down_while_training: list[bool] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.stood_down_while_training.append(trainer.strategy.controller.controller.served.engine.stood_down)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        controller = trainer.strategy.controller
        engine = controller.controller.served.engine
        greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
        generation = controller.call(engine.generate(PROMPT, greedy))
        sequence = torch.tensor([PROMPT + generation.token_ids])
        with torch.no_grad():
            trainer_logprobs = token_logprobs(pl_module.policy, sequence, vocab_size=pl_module.spec.vocab_size)
        completion = trainer_logprobs[0, len(PROMPT) :]
        self.max_error = max(self.max_error, float((completion - torch.tensor(generation.logprobs)).abs().max()))
        self.versions.append(engine.weight_version)


def test_after_each_step_the_colocated_engine_stood_down_and_scores_like_the_trainer() -> None:
    config = tiny_config("grpo.max_num_steps=3")
    check = EngineMatchesTrainer()
    trainer = tiny_trainer(config, engine_factory, [check])  # the check runs after the refit of the same step
    trainer.fit(GRPOModule(config))
    assert check.versions == [1, 2, 3]
    assert check.stood_down_while_training == [True, True, True]  # colocated: down for each train step, then woken
    assert check.max_error < 1e-4
