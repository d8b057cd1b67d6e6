"""The rollout side from plain Python, with no Lightning: start it, train two GRPO steps on its step stream with the
Lightning-free trainer code, refit the engine after each, shut it down.

Everything is real (tiny config, in-process data plane, colocated Megatron engine, controller); the driver runs in a
fresh interpreter, so ``lightning`` can only be in its ``sys.modules`` if the rollout side (or what it imports)
imported it.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers.cli import user_environment
from tests.helpers.configs import REPO, TEST_BASE

pytestmark = pytest.mark.slow
STEPS = 2


def drive_two_grpo_steps() -> dict[str, Any]:
    """Build the rollout side from the tests' tiny config, train STEPS GRPO steps through it (refitting the engine
    after each), shut it down; what happened, and which Lightning modules got imported."""
    from sc_lightning.algorithms import ClippedPGLoss
    from sc_lightning.config import load_config
    from sc_lightning.config.yaml_io import load_yaml_layers
    from sc_lightning.engines.factory import default_engine_factory
    from sc_lightning.engines.sampling import scoring_temperature
    from sc_lightning.models import load_policy
    from sc_lightning.models.warm_start import resolve_model_name
    from sc_lightning.rollout_side.side import RolloutSide
    from sc_lightning.trainer.optim import adamw
    from sc_lightning.trainer.policy_update import PolicyUpdate

    raw = load_yaml_layers(TEST_BASE, ["data_plane.backend=memory", f"grpo.max_num_steps={STEPS}"])
    config = load_config(raw, extra_top_level=("trainer", "seed_everything"))  # the Lightning block goes unread
    policy_cfg, seed = config.policy, config.algo.seed
    policy, spec, tokenizer = load_policy(
        resolve_model_name(policy_cfg.model_name, seed=seed),
        precision=policy_cfg.precision,
        seed=seed,
        tokenizer_name=policy_cfg.tokenizer_name,
    )
    optimizer, scheduler = adamw(policy, policy_cfg.optimizer, STEPS)
    loss_fn = ClippedPGLoss.from_config(config.loss_fn)
    engines: list[Any] = []

    def engine_factory(config: Any, weights: list[Any]) -> Any:
        engines.append(default_engine_factory(config, weights))
        return engines[-1]

    clock = SimpleNamespace(version=0)  # the trainer's weight version: one optimizer step per RL step
    trained: list[dict[str, Any]] = []
    side = RolloutSide(config, engine_factory)
    side.listen()
    try:
        side.start(SimpleNamespace(policy=policy, spec=spec, tokenizer=tokenizer))
        for step in itertools.islice(side.rl_steps(version=lambda: clock.version), STEPS):  # as Trainer(max_steps)
            if side.colocated:
                side.stand_down_engine()  # the engine frees the device for the train step
            update = PolicyUpdate(
                policy,
                optimizer,
                loss_fn,
                micro_batch_size=policy_cfg.train_micro_batch_size,
                clip_grad=policy_cfg.optimizer.clip_grad,
                scheduler=scheduler,
                vocab_size=spec.vocab_size,
                temperature=scoring_temperature(policy_cfg.generation.temperature),
                seq_logprob_error_threshold=config.algo.seq_logprob_error_threshold,
            )
            update.begin(step=clock.version, version=step.version)
            rows = 0
            for chunk in step.chunks():
                update.train_chunk(chunk)
                rows += len(chunk.rewards)
            metrics = update.finish()
            clock.version += 1
            report = side.refit(clock.version, wake=side.colocated)
            assert report is not None  # the leader's: this is the only rank
            trained.append({"version": step.version, "rows": rows, "refit": report.stats.trainer_version, **metrics})
    finally:
        side.shutdown()
    return {
        "trained": trained,
        "trainer_version": clock.version,
        "engine_version": engines[0].weight_version,
        "engines": len(engines),
        "shut_down": side.controller is None and side.data_plane is None,
        "lightning": sorted(m for m in sys.modules if m.split(".")[0] in ("lightning", "pytorch_lightning")),
    }


def test_the_rollout_side_trains_two_grpo_steps_from_plain_python_without_lightning() -> None:
    code = "import json, tests.test_rollout_side as t; print(json.dumps(t.drive_two_grpo_steps()))"
    # a user's environment: not the torch.distributed rendezvous this pytest worker may have set up
    env = user_environment()
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["lightning"] == []  # nothing imported Lightning
    assert facts["trainer_version"] == STEPS and facts["engine_version"] == STEPS and facts["engines"] == 1
    assert [step["version"] for step in facts["trained"]] == [0, 1]  # each step trained from the version before it
    assert [step["refit"] for step in facts["trained"]] == [1, 2]  # the controller moved on with each refit
    assert all(step["rows"] == 16 for step in facts["trained"])  # 4 groups x 4 generations (tests/small_steps.yaml)
    assert facts["shut_down"]
