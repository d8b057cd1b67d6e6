"""Every way a fit ends leaves the bundle of its last finished step, and the same fit resumes from it and goes on.

In-process fits (FAKE scripted engine; real model, controller, data plane, Trainer and callbacks): a callback's
``trainer.should_stop``, SIGTERM and SIGINT. ``trainer.max_time``, the refused Trainer limits and the stop line of the
real command are in tests/test_stop_reasons.py.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from lightning.pytorch import Callback, LightningModule, Trainer

from sc_lightning.callbacks.checkpoint import BundleCheckpoint
from sc_lightning.callbacks.stop import FitStop
from sc_lightning.checkpoint.bundle import TRAINER_FILE, latest_bundle
from sc_lightning.checkpoint.snapshots import config_identity, nothing_left_to_train, resume_point
from sc_lightning.config import SCConfig
from sc_lightning.lightning.module import GRPOModule
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.fits import tiny_config, tiny_trainer
from tests.helpers.scripts import Alternating


class StopAt(Callback):
    """At the end of step ``step``: set ``trainer.should_stop``, or send this process ``signum``."""

    def __init__(self, step: int, signum: int | None = None) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        """Stop (or signal) once, at ``step``."""
        if trainer.global_step != self.step:
            return
        if self.signum is None:
            trainer.should_stop = True
        else:
            os.kill(os.getpid(), self.signum)  # handled in this (the main) thread before the next bytecode


def config_with_bundles(tmp_path: Path, *overrides: str) -> SCConfig:
    """Eight steps at most, a bundle every 100: only the end of a fit writes one."""
    return tiny_config(
        "grpo.max_num_steps=8",
        "checkpointing.enabled=true",
        "checkpointing.save_data_plane=true",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "checkpointing.save_period=100",
        *overrides,
    )


def fit_once(config: SCConfig, stop: Callback | None) -> tuple[Trainer, FitStop]:
    """One fit from the newest bundle (if any), as the same command run again would; returns the trainer and its
    FitStop. ``stop`` runs before FitStop, so a signal it sends at the end of a step stops the fit after that step."""
    fit_stop = FitStop(config)
    callbacks = [fit_stop, BundleCheckpoint(config.checkpointing, max_steps=config.algo.max_num_steps)]
    trainer = tiny_trainer(config, lambda c, w: ScriptedEngine(Alternating()), [*([stop] if stop else []), *callbacks])
    bundle = latest_bundle(Path(config.checkpointing.checkpoint_dir))
    trainer.fit(GRPOModule(config), ckpt_path=str(bundle / TRAINER_FILE) if bundle else None)
    return trainer, fit_stop


def bundles(config: SCConfig) -> list[str]:
    """The bundle directories' names, in step order."""
    found = Path(config.checkpointing.checkpoint_dir).glob("step_*")
    return sorted((p.name for p in found), key=lambda name: int(name.split("_")[1]))


@pytest.mark.slow  # two fits, about a minute on 2 cores
def test_a_callback_setting_should_stop_leaves_its_last_step_bundle_and_the_next_fit_goes_on(tmp_path) -> None:
    config = config_with_bundles(tmp_path)
    trainer, stop = fit_once(config, StopAt(2))
    assert trainer.global_step == 2 and bundles(config) == ["step_2"]
    assert stop.reason == "trainer.should_stop was set by a callback" and stop.exit_code == 0
    trainer, stop = fit_once(config, StopAt(5))
    assert trainer.global_step == 5 and bundles(config) == ["step_2", "step_5"]


@pytest.mark.slow  # two fits, 6-110 s on 2 cores
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_the_fit_after_its_step_with_that_steps_bundle(tmp_path, signum: int) -> None:
    config = config_with_bundles(tmp_path)
    before = signal.getsignal(signum)
    trainer, stop = fit_once(config, StopAt(3, signum))
    assert trainer.global_step == 3 and bundles(config) == ["step_3"]
    assert stop.reason == f"{signal.Signals(signum).name} received" and stop.exit_code == 128 + signum
    assert signal.getsignal(signum) is before  # given back
    trainer, _ = fit_once(config, None)
    assert trainer.global_step == 8 and bundles(config) == ["step_3", "step_8"]


def test_a_fit_whose_prompts_ran_out_leaves_its_bundle_and_then_has_nothing_left_to_train(tmp_path) -> None:
    """12 prompts, one epoch, 4 per step: three steps, then the stream ends (not max_num_steps)."""
    rows = [json.dumps({"problem": f"{a}+{a}=", "expected_answer": str(2 * a)}) for a in range(12)]
    (tmp_path / "prompts.jsonl").write_text("\n".join(rows) + "\n")
    dataset = f"data.dataset_name={tmp_path / 'prompts.jsonl'}"
    config = config_with_bundles(tmp_path, dataset, "grpo.max_num_epochs=1")
    trainer, stop = fit_once(config, None)
    assert trainer.global_step == 3 and bundles(config) == ["step_3"]
    assert stop.reason == "the rollouts ran out (grpo.max_num_epochs 1 of the dataset)"
    checkpoint_dir = Path(config.checkpointing.checkpoint_dir)
    resume = resume_point(checkpoint_dir, "latest", config_identity(config))
    assert nothing_left_to_train(resume, config) == (
        f"nothing left to train: the newest bundle {checkpoint_dir / 'step_3'} (step 3) has trained every prompt of "
        "grpo.max_num_epochs=1 passes over the dataset; to train longer, run the same command with a larger "
        "--grpo.max_num_epochs"
    )
    assert nothing_left_to_train(resume, config_with_bundles(tmp_path, dataset, "grpo.max_num_epochs=2")) is None
