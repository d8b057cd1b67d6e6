"""On one GPU: the tiny example trains there, and the colocated engine agrees with the trainer through each refit.

Run by scripts/gpu_check.sh on the GPU machine; deselected where no GPU exists.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from sc_lightning import GRPOModule, default_engine_factory
from sc_lightning.models import logits_of, token_logprobs
from sc_lightning.types import SamplingParams
from tests.helpers.fits import tiny_config, tiny_trainer

pytestmark = pytest.mark.gpu

PROMPT = (2, 8, 13, 9, 16)  # "<s>5+6="
BF16_LOGPROB_TOLERANCE = 0.1  # nats: a KV-cached bf16 decode against one bf16 full forward of the same weights


class OnTheGpu(Callback):
    """After each step's refit: where the models live, the step's engine/trainer mismatch, and the engine's greedy
    completion of PROMPT against a full forward of the trainer."""

    def __init__(self) -> None:
        self.devices: set[str] = set()
        self.token_mult_prob_errors: list[float] = []
        self.greedy_equals_argmax: list[bool] = []
        self.max_logprob_error = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        controller = trainer.strategy.rollout_side.controller
        engine = controller.controller.served.engine
        policy, vocab = pl_module.policy, pl_module.spec.vocab_size
        self.devices |= {trainer.strategy.root_device.type, next(policy.parameters()).device.type}
        self.devices.add(next(engine._model.parameters()).device.type)
        self.token_mult_prob_errors.append(float(trainer.callback_metrics["train/token_mult_prob_error"]))
        greedy = controller.call(engine.generate(PROMPT, SamplingParams(max_new_tokens=4, temperature=0.0)))
        sequence = torch.tensor([PROMPT + greedy.token_ids])
        with torch.no_grad():
            argmax = logits_of(policy, sequence, vocab_size=vocab)[0, len(PROMPT) - 1 : -1].argmax(-1)
            logprobs = token_logprobs(policy, sequence, vocab_size=vocab)[0, len(PROMPT) :]
        self.greedy_equals_argmax.append(argmax.tolist() == list(greedy.token_ids))
        error = (logprobs.cpu() - torch.tensor(greedy.logprobs)).abs().max()
        self.max_logprob_error = max(self.max_logprob_error, float(error))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_tiny_example_trains_on_the_gpu_with_its_engine_agreeing(precision: str) -> None:
    config = tiny_config("grpo.max_num_steps=20", f"policy.precision={precision}")
    check = OnTheGpu()
    trainer = tiny_trainer(config, default_engine_factory, [check], accelerator="gpu")
    trainer.fit(GRPOModule(config))
    assert trainer.global_step == 20
    assert check.devices == {"cuda"}
    assert max(check.token_mult_prob_errors) < 1.05, check.token_mult_prob_errors
    assert all(check.greedy_equals_argmax), check.greedy_equals_argmax
    assert check.max_logprob_error < (1e-3 if precision == "fp32" else BF16_LOGPROB_TOLERANCE)
    perf = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("perf/")}
    assert set(perf) == {"perf/tokens_per_s", "perf/peak_memory_gib", "perf/alloc_retries", "perf/mfu"}, perf
    assert perf.pop("perf/alloc_retries") == 0, perf  # a tiny model never runs the allocator short
    assert all(value > 0 for value in perf.values()) and perf["perf/mfu"] < 1, perf  # the GPU's peak is known
