"""PPO through real fits: critic warm-up, staleness-0 equivalence, critic metrics, checkpoints, warm start.

The engine is the FAKE ScriptedEngine (deterministic, records weight pushes); the policy and critic (megatron-core),
losses, controller, data plane (in-process), Lightning Trainer and callbacks are real.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.callbacks.checkpoint import BundleCheckpoint
from sc_lightning.checkpoint.bundle import TRAINER_FILE, latest_bundle
from sc_lightning.config import SCConfig
from sc_lightning.controller.buffer import TQReplayBuffer
from sc_lightning.controller.build import rollout_settings
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.lightning.ppo_module import PPOModule
from sc_lightning.models import load_policy
from sc_lightning.models.value import load_critic
from sc_lightning.models.warm_start import resolve_model_name
from sc_lightning.rollout.datasets import build_dataset
from sc_lightning.rollout.envs import build_environment
from sc_lightning.rollout.manager import RolloutManager, ServedPolicy
from sc_lightning.rollout.prompts import PromptStream
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.trainer.chunks import load_chunk
from sc_lightning.trainer.critic_update import CriticUpdate, value_targets
from sc_lightning.trainer.optim import adamw, optimizer_state_to
from sc_lightning.trainer.policy_update import EmptyStepError, PolicyUpdate
from tests.helpers.fits import Recorder, ppo_config, tiny_trainer
from tests.helpers.fits import fit as train_pump_fit
from tests.helpers.scripts import TOKENIZER, Alternating

CRITIC_METRICS = {"loss", "values_mean", "values_min", "values_max", "returns_mean", "vf_clipfrac", "explained_var"}


def fit(config: SCConfig, callbacks: list[Callback] = (), **kwargs) -> tuple[Trainer, PPOModule, ScriptedEngine]:
    """A real PPO fit with the FAKE scripted engine; also returns the engine (its recorded weight pushes)."""
    engine = ScriptedEngine(Alternating())
    trainer, module = train_pump_fit(config, list(callbacks), engine=engine, module_class=PPOModule, **kwargs)
    return trainer, module, engine


def initial_policy(config: SCConfig) -> dict[str, torch.Tensor]:
    seed = config.algo.seed
    policy = load_policy(resolve_model_name(config.policy.model_name, seed=seed), precision="fp32", seed=seed)[0]
    return {name: value.clone() for name, value in policy.state_dict().items() if isinstance(value, torch.Tensor)}


@pytest.mark.slow  # PPO fits with a critic, 15-40 s each on 2 cores
def test_warm_up_trains_the_critic_only_and_pushes_no_weights() -> None:
    config = ppo_config("ppo.policy_training_start_step=2", "ppo.max_num_steps=3")
    recorder = Recorder()
    trainer, module, engine = fit(config, [recorder])
    assert trainer.global_step == 3  # warm-up steps count as RL steps
    assert engine.updates == [3]  # no push after steps 1 and 2 (warm-up); one after the first trained step
    assert [m.get("policy_trained", 1.0) for m in recorder.step_metrics] == [0.0, 0.0, 1.0]

    warm_only = ppo_config("ppo.policy_training_start_step=2", "ppo.max_num_steps=2")
    _, module, engine = fit(warm_only)
    before = initial_policy(warm_only)
    after = module.policy.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before), "the policy is bit-identical"
    assert engine.updates == []
    fresh = load_critic(resolve_model_name(warm_only.value.model_name, seed=warm_only.algo.seed), seed=7)
    assert not torch.equal(fresh.output_layer.weight, module.critic.output_layer.weight)


class CriticMetrics(Callback):
    """The critic/* values each step logged."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        logged = trainer.callback_metrics
        self.steps.append({k.removeprefix("critic/"): float(v) for k, v in logged.items() if k.startswith("critic/")})


def synchronous_reference(config: SCConfig, steps: int) -> list[tuple[float, float, float]]:
    """A plain generate → value stage → critic → policy loop (no controller, no Lightning): per step
    (policy loss, policy grad norm, critic loss)."""
    seed = config.algo.seed
    name = resolve_model_name(config.policy.model_name, seed=seed)
    policy = load_policy(name, precision="fp32", seed=seed)[0]
    critic = load_critic(name, precision="fp32", seed=seed)
    policy_opt, policy_sched = adamw(policy, config.policy.optimizer, config.algo.max_num_steps)
    critic_opt, critic_sched = adamw(critic, config.value.optimizer, config.algo.max_num_steps)
    update = PolicyUpdate(
        policy,
        policy_opt,
        ClippedPGLoss.from_config(config.loss_fn),
        micro_batch_size=config.policy.train_micro_batch_size,
        clip_grad=config.policy.optimizer.clip_grad,
        scheduler=policy_sched,
    )
    critic_update = CriticUpdate(
        critic,
        critic_opt,
        config.value_loss_fn,
        micro_batch_size=config.value.train_micro_batch_size,
        clip_grad=config.value.optimizer.clip_grad,
    )
    data_plane = MemoryDataPlane()
    served = ServedPolicy(ScriptedEngine(Alternating()))
    manager = RolloutManager(
        served,
        build_environment(config.env),
        TOKENIZER,
        TQReplayBuffer(data_plane),
        rollout_settings(config),
    )
    prompts = PromptStream(
        build_dataset(config.data, TOKENIZER, seed=seed),
        config.algo.num_prompts_per_step,
        shuffle=config.data.shuffle,
        seed=seed,
        max_epochs=config.algo.max_num_epochs,
    )
    results = []
    for _, batch in zip(range(steps), prompts, strict=False):

        async def generate(batch=batch):
            return [await manager.generate_and_push(prompt) for prompt in batch]

        chunk = load_chunk(
            data_plane,
            asyncio.run(generate()),
            pad_token_id=TOKENIZER.pad_token_id,
            overlong_filtering=False,
            leave_one_out=True,
            normalize_rewards=True,
        )
        targets = value_targets(
            critic, chunk, config.ppo.adv_estimator, micro_batch_size=config.value.train_micro_batch_size
        )
        critic_loss = critic_update.train(chunk, targets, config.ppo.critic_epochs())["loss"]
        critic_sched.step()
        chunk.advantages = targets.advantages
        update.begin()
        update.train_chunk(chunk)
        metrics = update.finish()
        results.append((metrics["loss"], metrics["grad_norm"], critic_loss))
    return results


@pytest.mark.slow  # PPO fits with a critic, 15-40 s each on 2 cores
def test_staleness_zero_trains_exactly_what_a_synchronous_ppo_loop_would() -> None:
    config = ppo_config()
    recorder, critic = Recorder(), CriticMetrics()
    fit(config, [recorder, critic])
    fitted = [(m["loss"], m["grad_norm"], c["loss"]) for m, c in zip(recorder.step_metrics, critic.steps, strict=True)]
    reference = synchronous_reference(config, 3)
    assert any(abs(grad) > 0 for _, grad, _ in reference), "the script must give the step reward variance"
    flat = [x for row in fitted for x in row]
    assert flat == pytest.approx([x for row in reference for x in row], rel=1e-5, abs=1e-7)
    assert all(m["staleness_max"] == 0 for m in recorder.step_metrics)
    assert all(set(step) >= CRITIC_METRICS for step in critic.steps)
    assert all(step["values_min"] <= step["values_mean"] <= step["values_max"] for step in critic.steps)


@pytest.mark.slow  # PPO fits with a critic, 15-40 s each on 2 cores
def test_several_epochs_measure_the_ratio_against_the_policy_the_step_started_with() -> None:
    recorder = Recorder()
    fit(ppo_config("ppo.ppo_epochs=3", "ppo.critic_ppo_epochs=2", "ppo.max_num_steps=2"), [recorder])
    # the last of 3 epochs sees a moved policy: its ratio to pi_old is no longer exactly 1
    assert any(m["probs_ratio_max"] != pytest.approx(1.0, abs=1e-9) for m in recorder.step_metrics)


@pytest.mark.slow  # PPO fits with a critic, 15-40 s each on 2 cores
def test_several_epochs_mask_the_same_rows_by_logprob_error_and_report_them_once() -> None:
    """The mask depends on pi_old and pi_gen, both fixed over the step: every epoch masks the same rows, and the
    step reports them once (the last epoch's metrics), not once per epoch."""
    knobs = ("ppo.max_num_steps=1", "ppo.ppo_epochs=2")
    logged_only = Recorder()
    fit(ppo_config(*knobs), [logged_only])
    (free,) = logged_only.step_metrics
    low, high = free["min_seq_mult_prob_error"], free["max_seq_mult_prob_error"]
    assert 1.0 <= low < high, "the scripted engine's constant logprobs give rows different errors"
    threshold = (low + high) / 2
    masking = Recorder()
    fit(ppo_config(*knobs, f"ppo.seq_logprob_error_threshold={threshold}"), [masking])
    (step,) = masking.step_metrics
    masked = step["num_masked_seqs_by_logprob_error"]
    assert 0 < masked < 16 and step["global_valid_seqs"] == free["global_valid_seqs"] - masked
    # the same first step's rows and pi_old: the statistics before the mask are those of the unmasked run
    for name in ("max_seq_mult_prob_error", "min_seq_mult_prob_error", "mean_seq_mult_prob_error"):
        assert step[name] == pytest.approx(free[name], rel=1e-6)
    assert step["max_seq_mult_prob_error_after_mask"] <= threshold < step["max_seq_mult_prob_error"]
    assert free["num_masked_seqs_by_logprob_error"] == 0.0 and free["masked_correct_pct"] == 0.0


@pytest.mark.slow  # PPO fits with a critic, 10-70 s on 2 cores
def test_a_ppo_step_masked_whole_by_logprob_error_names_the_ppo_knob() -> None:
    config = ppo_config("ppo.max_num_steps=1", "ppo.seq_logprob_error_threshold=0.5")  # every error is >= 1
    with pytest.raises(EmptyStepError, match=r"ppo\.seq_logprob_error_threshold=0\.5 masked 16 of 16 sequences"):
        fit(config)


def test_offloading_moves_the_adam_moments_and_leaves_the_step_counters() -> None:
    """The moments really move (to ``meta`` here, standing in for an accelerator); the PPO fits above run with
    policy.offload_optimizer_for_logprob on, so a state that did not come back intact would break their equivalence."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    optimizer_state_to(optimizer, torch.device("meta"))
    for state in optimizer.state.values():
        assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta
        assert not state["step"].is_meta


@pytest.mark.slow  # PPO fits with a critic, 15-40 s each on 2 cores
def test_a_resume_in_the_middle_of_warm_up_continues_it(tmp_path: Path) -> None:
    knobs = [
        "ppo.policy_training_start_step=3",
        "checkpointing.enabled=true",
        "checkpointing.save_data_plane=true",
        f"checkpointing.checkpoint_dir={tmp_path}",
        "checkpointing.save_period=1",
    ]
    first = ppo_config("ppo.max_num_steps=2", *knobs)
    _, module, _ = fit(first, [BundleCheckpoint(first.checkpointing, max_steps=2)])
    critic_at_2 = {k: v.clone() for k, v in module.critic.state_dict().items() if isinstance(v, torch.Tensor)}
    resumed = ppo_config("ppo.max_num_steps=4", *knobs)
    recorder = Recorder()
    bundle = latest_bundle(tmp_path)
    trainer, module, engine = fit(
        resumed, [BundleCheckpoint(resumed.checkpointing, max_steps=4), recorder], ckpt_path=str(bundle / TRAINER_FILE)
    )
    assert trainer.global_step == 4
    assert [m.get("policy_trained", 1.0) for m in recorder.step_metrics] == [0.0, 1.0]  # step 2 warm, step 3 trains
    assert engine.updates[-1] == 4 and 3 not in engine.updates  # no push after the last warm-up step

    # warm start: a fresh run seeds its critic from the bundle of step 2
    seeded = ppo_config("ppo.max_num_steps=1", f"ppo.warm_start_value_checkpoint={tmp_path / 'step_2'}")
    module = PPOModule(seeded)
    trainer = tiny_trainer(seeded, lambda c, w: ScriptedEngine(Alternating()), max_steps=0)
    trainer.fit(module)
    assert all(torch.equal(critic_at_2[k], v) for k, v in module.critic.state_dict().items() if k in critic_at_2)


@pytest.mark.slow  # PPO fits with a critic, 15-40 s each on 2 cores
def test_a_warm_start_from_a_distributed_checkpoint_reshards_the_critic(tmp_path: Path) -> None:
    """A bundle written with megatron's distributed optimizer keeps its models in ``sharded/``: a fresh run seeds
    its critic from there, weights and AdamW moments equal to the saving run's."""
    sliced = ["policy.megatron_cfg.use_distributed_optimizer=true", "value.megatron_cfg.use_distributed_optimizer=true"]
    knobs = ["checkpointing.enabled=true", f"checkpointing.checkpoint_dir={tmp_path}", "checkpointing.save_period=1"]
    first = ppo_config("ppo.max_num_steps=1", *sliced, *knobs)
    _, saved, _ = fit(first, [BundleCheckpoint(first.checkpointing, max_steps=1)])
    assert (tmp_path / "step_1" / "sharded").is_dir() and not torch.load(
        tmp_path / "step_1" / TRAINER_FILE, weights_only=False
    )["state_dict"]
    seeded = ppo_config("ppo.max_num_steps=1", *sliced, f"ppo.warm_start_value_checkpoint={tmp_path / 'step_1'}")
    module = PPOModule(seeded)
    tiny_trainer(seeded, lambda c, w: ScriptedEngine(Alternating()), max_steps=0).fit(module)
    assert_same_tensors(saved.critic.state_dict(), module.critic.state_dict())
    saved_moments, loaded_moments = (adamw_moments(m.optimizers()[1].optimizer) for m in (saved, module))
    assert saved_moments and len(saved_moments) == len(loaded_moments)
    assert all(torch.equal(a, b) for a, b in zip(saved_moments, loaded_moments, strict=True))


def adamw_moments(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """AdamW's moments, parameter by parameter in its groups' order."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return [optimizer.state[p][name] for p in params if p in optimizer.state for name in ("exp_avg", "exp_avg_sq")]


def assert_same_tensors(expected: dict[str, object], actual: dict[str, object]) -> None:
    """Every tensor of ``expected`` is in ``actual``, equal."""
    tensors = {k: v for k, v in expected.items() if isinstance(v, torch.Tensor)}
    assert tensors and all(torch.equal(v, actual[k]) for k, v in tensors.items())


def test_a_missing_warm_start_checkpoint_is_named(tmp_path: Path) -> None:
    config = ppo_config("ppo.max_num_steps=1", f"ppo.warm_start_value_checkpoint={tmp_path / 'nope'}")
    with pytest.raises(FileNotFoundError, match=r"ppo.warm_start_value_checkpoint=.*nope: no checkpoint"):
        fit(config)


def test_the_warm_up_lookahead_narrows_when_the_warm_up_ends() -> None:
    from sc_lightning.controller.build import build_controller
    from sc_lightning.rollout.datasets import ArithmeticDataset
    from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment

    config = ppo_config(
        "policy.generation.colocated.enabled=false",
        "async_rl.sampler.max_lookahead_versions=0",
        "async_rl.sampler.warmup_lookahead_versions=2",
        "ppo.policy_training_start_step=2",
        "async_rl.max_buffered_rollouts=12",
    )

    def build():
        return build_controller(
            config,
            data_plane=MemoryDataPlane(),
            engine=ScriptedEngine(Alternating()),
            environment=ArithmeticEnvironment(),
            tokenizer=TOKENIZER,
            dataset=ArithmeticDataset(64, 0, TOKENIZER),
        )

    async def scenario() -> list[int]:
        controller, windows = build(), []
        for version in (1, 2, 3):
            windows.append(controller.sampler.gate_window)
            await controller.begin_refit(version)
            await controller.finish_refit(version)
        windows.append(controller.sampler.gate_window)
        resumed = build()
        await resumed.restore(controller.checkpoint_state(), group_size=4)
        windows.append(resumed.sampler.gate_window)  # a resume after the warm-up starts narrow
        return windows

    assert asyncio.run(scenario()) == [2, 2, 0, 0, 0]
