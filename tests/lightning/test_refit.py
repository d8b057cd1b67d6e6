"""Refit: after every RL step the engine holds exactly the trainer's new weights."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from sc_lightning.lightning.module import GRPOModule
from sc_lightning.models import token_logprobs
from sc_lightning.models.megatron import megatron_weights
from sc_lightning.types import SamplingParams
from tests.helpers.fits import megatron_engine_factory, tiny_config, tiny_trainer

PROMPT = (2, 8, 13, 9, 16)  # "<s>5+6="


class EngineMatchesTrainer(Callback):
    """After the refit of each step: the engine's greedy completion and its logprobs equal the trainer's."""

    def __init__(self) -> None:
        self.versions: list[int] = []
        self.max_error: float = 0.0
        self.stood_down_while_training: list[bool] = []
        self.exact: list[bool] = []
        self.megatron_layout: list[bool] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.stood_down_while_training.append(
            trainer.strategy.rollout_side.controller.controller.served.engine.stood_down
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        controller = trainer.strategy.rollout_side.controller
        engine = controller.controller.served.engine
        greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
        generation = controller.call(engine.generate(PROMPT, greedy))
        sequence = torch.tensor([PROMPT + generation.token_ids])
        with torch.no_grad():
            trainer_logprobs = token_logprobs(pl_module.policy, sequence, vocab_size=pl_module.spec.vocab_size)
        completion = trainer_logprobs[0, len(PROMPT) :]
        self.max_error = max(self.max_error, float((completion - torch.tensor(generation.logprobs)).abs().max()))
        self.versions.append(engine.weight_version)
        replica = dict(megatron_weights(engine._model))  # the in-process engine took the live parameters as they are
        self.exact.append(all(torch.equal(replica[name], p) for name, p in megatron_weights(pl_module.policy)))
        self.megatron_layout.append(trainer.strategy.rollout_side.accepts_megatron_weights)


def test_after_each_step_the_colocated_engine_stood_down_and_scores_like_the_trainer() -> None:
    config = tiny_config("grpo.max_num_steps=3")
    check = EngineMatchesTrainer()
    trainer = tiny_trainer(config, megatron_engine_factory, [check])  # the check runs after the refit of the same step
    trainer.fit(GRPOModule(config))
    assert check.versions == [1, 2, 3]
    assert check.stood_down_while_training == [True, True, True]  # colocated: down for each train step, then woken
    assert check.max_error < 1e-4
    assert check.exact == [True] * 3 and check.megatron_layout == [True] * 3  # one multi-tensor copy per refit


class LoggedEachStep(Callback):
    """The monitor's metrics as they stand after each step's callbacks."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def test_the_rollout_monitor_logs_each_refit_and_names_a_wrong_order() -> None:
    from lightning.pytorch import Trainer
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from sc_lightning import RefitCallback, RolloutMonitor, SingleControllerStrategy

    config = tiny_config("grpo.max_num_steps=2")
    logged = LoggedEachStep()
    tiny_trainer(config, megatron_engine_factory, [logged]).fit(GRPOModule(config))
    assert [step["rollout/selected_total"] for step in logged.steps] == [4.0, 8.0]  # 4 groups a step
    assert all(
        step["timing/train/weight_sync"] > 0 and step["timing/train/total_step_time"] > 0 for step in logged.steps
    )
    assert all(step["train/dropped_prompt_groups"] == 0 for step in logged.steps)
    assert [step["survivorship/trained_groups"] for step in logged.steps] == [4.0, 4.0]
    # tokens are never older than their group's start weight: per-token staleness is bounded by the group's
    assert all(0 <= step["train/token_staleness_max"] <= step["train/staleness_max"] for step in logged.steps)

    wrong = Trainer(
        strategy=SingleControllerStrategy(config, megatron_engine_factory),
        callbacks=[RolloutMonitor(), RefitCallback()],
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(MisconfigurationException, match="list it after RefitCallback"):
        wrong.fit(GRPOModule(config))
