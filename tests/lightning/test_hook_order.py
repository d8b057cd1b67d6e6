"""The order of one RL step's phases, pinned: select, every chunk, the optimizer step, the refit, the bundle.

A recording callback sees Lightning's hooks, and it records the controller calls by wrapping the transport every
train-side call goes through (``ControllerHandle._invoke``). The engine is the FAKE ScriptedEngine; the model,
controller, data plane (in-process), Trainer, RefitCallback and BundleCheckpoint are real.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from lightning.pytorch import Callback

from sc_lightning.callbacks.checkpoint import BundleCheckpoint
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.lightning.ppo_module import PPOModule
from tests.helpers.fits import fit, ppo_config, tiny_config

STEPS = 2
STREAMING = [  # 4 groups a step, trained in chunks of at least 2 as they become ready
    "async_rl.min_groups_for_streaming_train=2",
    "async_rl.max_buffered_rollouts=8",
    "async_rl.max_inflight_prompts=8",
]


class PhaseRecorder(Callback):
    """Records the phases of each RL step, from Lightning's hooks and from the controller calls."""

    def __init__(self) -> None:
        self.phases: list[str] = []

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """The strategy has started the controller: record every train-side call on its way through."""
        handle = trainer.strategy.rollout_side.controller
        invoke = handle._invoke

        def recording(method: str, *args: Any, **kwargs: Any) -> Any:
            result = invoke(method, *args, **kwargs)
            if method == "select":
                self.phases.append("select" if result else "select-none")
            elif method == "refit":
                self.phases.append("refit-wake" if kwargs["wake"] else "refit")
            else:
                self.phases.append(method)
            return result

        handle._invoke = recording

    def _note(self, phase: str) -> None:
        if not self.phases or self.phases[-1] != phase:  # one entry per run of micro-batch backward passes
            self.phases.append(phase)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """A step's first chunk is selected; training starts."""
        self._note("batch_start")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """A chunk (or a PPO epoch's batch) is trained."""
        self._note("backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """The step's counted optimizer step."""
        self._note("optimizer_step")

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """The bundle's trainer checkpoint is being written."""
        self._note("bundle")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """The step is over."""
        self._note("batch_end")


def step_pattern(*, colocated: bool, ppo: bool) -> str:
    """One RL step's phases as a regular expression over the space-joined record."""
    stand_down = "stand_down_engine " if colocated else ""
    if ppo:  # PPO trains the step as one batch: every chunk is selected before the value stage and the epochs
        train = r"(select )*backward (optimizer_step )?(backward )*optimizer_step "
    else:  # GRPO trains each chunk as it arrives: backward, then the next select
        train = r"backward (select backward )*optimizer_step "
    # the refit: the policy streamed to the engine bucket by bucket, a colocated engine woken, dispatch reopened
    refit = "begin_refit (push_weights )+" + ("wake_engine " if colocated else "") + "finish_refit stats "
    # callbacks run in registration order (the refit callback first: the engine stands down before the recorder
    # sees the batch start, and the refit comes before the recorder sees its end), except that Lightning runs
    # Checkpoint callbacks last: the bundle, registered first, is written after every other callback's hook
    return f"select {stand_down}batch_start {train}{refit}batch_end bundle snapshot "


@pytest.mark.parametrize(
    ("module_class", "colocated"),
    [
        pytest.param(GRPOModule, False, id="grpo-separate"),
        pytest.param(PPOModule, False, id="ppo-separate", marks=pytest.mark.slow),  # a critic, 15-40 s on 2 cores
        pytest.param(GRPOModule, True, id="grpo-colocated"),
        pytest.param(PPOModule, True, id="ppo-colocated", marks=pytest.mark.slow),  # a critic, 10-70 s on 2 cores
    ],
)
def test_one_rl_step_runs_select_chunks_optimizer_step_refit_bundle_in_order(
    module_class: type[GRPOModule], colocated: bool, tmp_path
) -> None:
    knobs = [
        *STREAMING,
        f"policy.generation.colocated.enabled={str(colocated).lower()}",
        "checkpointing.enabled=true",
        f"checkpointing.checkpoint_dir={tmp_path}",
        "checkpointing.save_period=1",
    ]
    ppo = module_class is PPOModule
    config = (
        ppo_config(f"ppo.max_num_steps={STEPS}", *knobs) if ppo else tiny_config(f"grpo.max_num_steps={STEPS}", *knobs)
    )
    recorder = PhaseRecorder()
    trainer, _ = fit(
        config, [BundleCheckpoint(config.checkpointing, max_steps=STEPS), recorder], module_class=module_class
    )[:2]
    assert trainer.global_step == STEPS
    record = " ".join(recorder.phases) + " "
    step = step_pattern(colocated=colocated, ppo=ppo)
    assert re.fullmatch(f"({step}){{{STEPS}}}(select-none )?", record), record
