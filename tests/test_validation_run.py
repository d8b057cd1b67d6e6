"""Validation in a real tiny run (the CLI, as users run it), alone (``validate``) and across a resume: ``val/*``
once per validated step, each at its step's weight version."""

from __future__ import annotations

import csv
import json
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from sc_lightning.callbacks.validation import ValidationMonitor
from sc_lightning.config.algorithm import GRPOConfig
from tests.helpers.cli import run
from tests.helpers.configs import REPO, TINY

VALIDATE = ["--grpo.val_period", "2", "--grpo.val_at_start", "true", "--grpo.val_at_end", "true"]


def val_rows(root) -> list[dict[str, str]]:
    """Every CSV row with a val/reward, over every logger version (a resume starts a new one)."""
    rows = []
    for metrics in sorted(root.glob("lightning_logs/version_*/metrics.csv")):
        rows += [row for row in csv.DictReader(metrics.open()) if row.get("val/reward")]
    return rows


@pytest.mark.long(minutes=1.5)
@pytest.mark.slow
def test_a_tiny_run_validates_each_period_once_at_its_version_and_a_resume_logs_no_step_twice(tmp_path) -> None:
    """fit 4 steps, validate the step-4 bundle alone, resume to 6: val/* at 0, 2, 4, 6, once each."""

    def fit(steps: int) -> None:
        result = run(
            "fit",
            "--config",
            TINY,
            *VALIDATE,
            "--grpo.max_num_steps",
            str(steps),
            "--checkpointing.enabled=true",
            "--checkpointing.save_data_plane=true",
            "--checkpointing.save_period=2",
            f"--checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        )
        assert result.returncode == 0, result.stderr[-3000:]

    fit(4)
    # the validate command on the step-4 bundle samples as the run's validation did: the same scores
    alone = run(
        "validate",
        "--config",
        TINY,
        "--ckpt_path",
        str(tmp_path / "ckpt" / "step_4"),
        f"--trainer.default_root_dir={tmp_path / 'alone'}",
        "--trainer.enable_progress_bar=false",
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    printed = json.loads(alone.stdout.strip().splitlines()[-1])
    assert printed == json.loads((tmp_path / "alone" / "validation.json").read_text())
    step_4 = next(row for row in val_rows(tmp_path) if row["step"] == "4")
    assert printed["step"] == 4 and printed["val/weight_version"] == 4
    assert printed["val/reward"] == pytest.approx(float(step_4["val/reward"]))
    fit(6)  # resumes from step_4, whose validation the checkpoint settled and logged: not redone
    rows = val_rows(tmp_path)
    assert [int(row["step"]) for row in rows] == [0, 2, 4, 6]
    for row in rows:  # every completion of a validation was generated at this version (else the run fails)
        assert float(row["val/weight_version"]) == int(row["step"])
        assert 0 <= float(row["val/accuracy"]) <= 1 and float(row["val/samples"]) == 100
        assert float(row["val/completion_len_mean"]) > 0


DISTILL = "configs/distill_tiny.yaml"
DISTILL_PROMPTS = "examples/distill_tiny_prompts.jsonl"


@pytest.mark.long(minutes=1)
@pytest.mark.slow
def test_a_distillation_run_validates_each_teacher_s_agreement_with_the_student(tmp_path) -> None:
    """configs/distill_tiny.yaml for 4 steps, validating its own 200 prompts at 0, 2, 4: each validation logs per
    teacher its routed prompts (the dataset's routing counts), their reward (which makes up val/reward) and the
    student-teacher KL per token (positive: the student knows neither task); the validate command on the initial
    policy scores what the run's step 0 scored."""
    common = ["--config", DISTILL, "--data.val_dataset_name", DISTILL_PROMPTS, "--trainer.enable_progress_bar=false"]
    fit = run(
        "fit",
        *common,
        *VALIDATE,
        "--grpo.max_num_steps",
        "4",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    alone = run("validate", *common, f"--trainer.default_root_dir={tmp_path / 'alone'}")
    assert alone.returncode == 0, alone.stderr[-3000:]
    routed = Counter(json.loads(line)["teacher"] for line in (REPO / DISTILL_PROMPTS).read_text().splitlines())
    rows = val_rows(tmp_path)
    assert [int(row["step"]) for row in rows] == [0, 2, 4]
    for row in rows:
        samples = {alias: float(row[f"val/teacher_samples/{alias}"]) for alias in routed}
        assert samples == routed and float(row["val/samples"]) == sum(routed.values())
        rewards = sum(float(row[f"val/teacher_reward/{alias}"]) * samples[alias] for alias in routed)
        assert rewards / sum(routed.values()) == pytest.approx(float(row["val/reward"]))
        assert all(1.0 < float(row[f"val/teacher_kl/{alias}"]) < 10.0 for alias in routed)
    printed = json.loads(alone.stdout.strip().splitlines()[-1])
    for alias in routed:
        assert printed[f"val/teacher_kl/{alias}"] == pytest.approx(float(rows[0][f"val/teacher_kl/{alias}"]))


class FakeController:
    """FAKE controller handle: records the validations the monitor starts."""

    def __init__(self) -> None:
        self.started: list[int] = []

    def validate(self, step: int) -> None:
        """Record the step."""
        self.started.append(step)


@pytest.mark.parametrize(("last_logged", "redone"), [(2, [4]), (4, [])])
def test_a_resume_redoes_the_validation_of_its_step_only_if_it_was_not_logged(last_logged: int, redone: list) -> None:
    monitor = ValidationMonitor(GRPOConfig(val_period=2, max_num_steps=10))
    monitor.load_state_dict({"last_logged_step": last_logged})
    controller = FakeController()
    trainer: Any = SimpleNamespace(
        global_step=4,
        is_global_zero=True,
        strategy=SimpleNamespace(rollout_side=SimpleNamespace(controller=controller)),
    )
    monitor.on_train_start(trainer, None)  # type: ignore[arg-type]
    assert controller.started == redone
