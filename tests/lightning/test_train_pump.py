"""The train pump in Lightning: hook order, synchronous equivalence, streamed steps.

The engine is the FAKE ScriptedEngine (a deterministic script, so runs can be compared exactly); the model,
loss, controller, data plane (in-process), Lightning Trainer and callbacks are real.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.config import SCConfig
from sc_lightning.controller.buffer import TQReplayBuffer
from sc_lightning.controller.build import rollout_settings
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.models import load_policy
from sc_lightning.models.warm_start import resolve_model_name
from sc_lightning.rollout.datasets import build_dataset
from sc_lightning.rollout.envs import build_environment
from sc_lightning.rollout.manager import RolloutManager, ServedPolicy
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.trainer.chunks import load_chunk
from sc_lightning.trainer.optim import adamw
from sc_lightning.trainer.policy_update import PolicyUpdate
from tests.helpers.fits import Recorder, fit, tiny_config
from tests.helpers.scripts import TOKENIZER, Alternating


def test_hook_order_for_two_rl_steps() -> None:
    recorder = Recorder()
    trainer, _ = fit(tiny_config("grpo.max_num_steps=2", "policy.train_micro_batch_size=8"), [recorder])
    assert trainer.global_step == 2
    backward = ["on_before_backward", "on_after_backward"]
    # 16 rows in micro-batches of 8: two backward passes, then exactly one optimizer step per RL step
    step = ["on_train_batch_start", *backward, *backward, "on_before_optimizer_step", "on_train_batch_end"]
    assert recorder.calls == [
        "setup",
        "on_fit_start",
        "on_train_start",
        "on_train_epoch_start",
        *step,
        *step,
        "on_train_epoch_end",
        "on_train_end",
        "on_fit_end",
        "teardown",
    ]


def test_model_checkpoint_saves_per_rl_step_and_holds_the_trained_weights(tmp_path) -> None:
    """Lightning's ModelCheckpoint works unchanged: one file per RL step, named and stamped by the RL step count."""
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    trainer, module = fit(tiny_config("grpo.max_num_steps=2"), [saver])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=1.ckpt", "step=2.ckpt"]
    first, last = (torch.load(tmp_path / f"step={n}.ckpt", weights_only=False) for n in (1, 2))
    assert (first["global_step"], last["global_step"]) == (1, 2)
    trained = module.state_dict()
    assert set(last["state_dict"]) == set(trained)
    for name, value in trained.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(last["state_dict"][name], value), name
    tensors = [n for n, v in trained.items() if isinstance(v, torch.Tensor)]
    moved = [n for n in tensors if not torch.equal(first["state_dict"][n], trained[n])]
    assert moved, "the second RL step changed the weights, so the step=1 file differs from the step=2 one"
    assert len(last["optimizer_states"]) == 1 and last["optimizer_states"][0]["state"], "AdamW moments are saved"


def synchronous_reference_losses(config: SCConfig, steps: int) -> list[tuple[float, float]]:
    """A plain generate→train loop (no controller, no Lightning) over the same prompts, engine script and seeds."""
    import asyncio

    from sc_lightning.rollout.prompts import PromptStream

    seed = config.algo.seed
    policy = load_policy(resolve_model_name(config.policy.model_name, seed=seed), precision="fp32", seed=seed)[0]
    opt = config.policy.optimizer
    optimizer, scheduler = adamw(policy, opt, config.algo.max_num_steps)
    update = PolicyUpdate(
        policy,
        optimizer,
        ClippedPGLoss.from_config(config.loss_fn),
        micro_batch_size=config.policy.train_micro_batch_size,
        clip_grad=opt.clip_grad,
        scheduler=scheduler,
    )
    data_plane = MemoryDataPlane()
    buffer = TQReplayBuffer(data_plane)
    served = ServedPolicy(ScriptedEngine(Alternating()))
    manager = RolloutManager(served, build_environment(config.env), TOKENIZER, buffer, rollout_settings(config))
    prompts = PromptStream(
        build_dataset(config.data, TOKENIZER, seed=config.algo.seed),
        config.algo.num_prompts_per_step,
        shuffle=config.data.shuffle,
        seed=config.algo.seed,
        max_epochs=config.algo.max_num_epochs,
    )
    results = []
    for _, batch in zip(range(steps), prompts, strict=False):

        async def generate_step(batch=batch):
            return [await manager.generate_and_push(prompt) for prompt in batch]

        groups = asyncio.run(generate_step())
        chunk = load_chunk(
            data_plane,
            groups,
            pad_token_id=TOKENIZER.pad_token_id,
            overlong_filtering=False,
            leave_one_out=True,
            normalize_rewards=True,
        )
        update.begin()
        update.train_chunk(chunk)
        metrics = update.finish()
        results.append((metrics["loss"], metrics["grad_norm"]))
    return results


def test_staleness_zero_trains_exactly_what_a_synchronous_loop_would() -> None:
    config = tiny_config("grpo.max_num_steps=3")
    recorder = Recorder()
    fit(config, [recorder])
    async_run = [(m["loss"], m["grad_norm"]) for m in recorder.step_metrics]
    reference = synchronous_reference_losses(config, 3)
    assert any(abs(grad) > 0 for _, grad in reference), "the script must give the groups reward variance"
    flat = [x for pair in async_run for x in pair]
    assert flat == pytest.approx([x for pair in reference for x in pair], rel=1e-5, abs=1e-7)
    assert all(m["staleness_max"] == 0 for m in recorder.step_metrics)


def test_streamed_steps_stay_inside_the_staleness_window() -> None:
    config = tiny_config(
        "grpo.max_num_steps=4",
        "policy.generation.colocated.enabled=false",
        "async_rl.sampler.name=weight_fifo",
        "async_rl.sampler.max_staleness_versions=1",
        "async_rl.max_buffered_rollouts=8",
        "async_rl.max_inflight_prompts=8",
        "async_rl.min_groups_for_streaming_train=2",
    )
    recorder = Recorder()
    trainer, _ = fit(config, [recorder])
    assert trainer.global_step == 4
    assert all(m["staleness_max"] <= 1 for m in recorder.step_metrics)
    assert all(m["num_valid_samples"] == 16 for m in recorder.step_metrics)  # 4 groups x 4 generations per step


class EndpointProbe(Callback):
    """After each step's refit, asks the strategy's completions endpoint for a completion."""

    def __init__(self) -> None:
        self.responses: list[dict] = []
        self.url: str | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """POST one completion request and keep the answer."""
        self.url = trainer.strategy.rollout_side.endpoint_url
        request = urllib.request.Request(
            f"{self.url}/completions",
            data=json.dumps({"prompt": "2+3=", "max_tokens": 2}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            self.responses.append(json.load(response))


def test_the_strategy_serves_the_engine_over_http_during_fit() -> None:
    probe = EndpointProbe()
    trainer, _ = fit(
        tiny_config("grpo.max_num_steps=2", "policy.generation.mcore_generation_config.expose_http_server=true"),
        [probe],
    )
    assert trainer.global_step == 2 and len(probe.responses) == 2
    # each probe runs after that step's refit: the endpoint answers with the weights of the step just trained
    assert [r["weight_version_end"] for r in probe.responses] == [1, 2]
    # the scripted engine answers a prompt's k-th request right when k is even, one too high when odd
    assert [r["choices"][0]["text"] for r in probe.responses] == ["5", "6"]
    with pytest.raises(urllib.error.URLError):  # stopped at teardown
        urllib.request.urlopen(f"{probe.url}/models", timeout=5)


def test_train_data_log_records_every_trained_row(tmp_path) -> None:
    fit(tiny_config("grpo.max_num_steps=3", "data.train_data_log=true"), [], root=tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] * 16 + [1] * 16 + [2] * 16  # 4 groups x 4 generations per step
    assert set(rows[0]) == {
        "step",
        "prompt_index",
        "prompt_id",
        "group_id",
        "generation_index",
        "start_weight",
        "end_weight",
        "target_step",
        "reward",
    }
    assert all(r["prompt_id"] == f"arithmetic-{r['prompt_index']:06d}" for r in rows)
    assert all(r["start_weight"] == r["step"] and r["end_weight"] == r["step"] for r in rows)  # synchronous
    groups = Counter(r["group_id"] for r in rows)
    assert len(groups) == 12 and set(groups.values()) == {4}
    assert sorted({r["generation_index"] for r in rows}) == [0, 1, 2, 3]
    assert {r["reward"] for r in rows} == {0.0, 1.0}  # the script alternates right and wrong answers


def test_the_module_trains_with_the_configured_micro_batching() -> None:
    """policy.train_micro_batch_* reach the step's PolicyUpdate (rows, token budget, width multiple)."""
    knobs = {"size": 3, "tokens": 96, "width_multiple": 16}
    config = tiny_config(*(f"policy.train_micro_batch_{name}={value}" for name, value in knobs.items()))
    module = GRPOModule(config)
    module.configure_model()
    update = module.policy_update(optimizer=torch.optim.SGD(module.policy.parameters(), lr=0.1), step_scheduler=False)
    assert (update.micro_batch_size, update.micro_batch_tokens, update.micro_batch_width_multiple) == (3, 96, 16)
