"""The shipped tiny examples visibly learn: each config, unchanged, trained to its end through the real command line
within the issue's 10-minute bar, and the reward climbs.

Each test runs alone on the machine (marker ``exclusive``): the bar is for the example alone on the 2-core box.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from PIL import Image

from sc_lightning.rollout.goodput import EngineTime
from sc_lightning.trainer.goodput import TRAINER_PARTS
from tests.helpers.cli import run, step_metrics
from tests.helpers.configs import REPO, TINY

# Each test starts a Python process that imports Lightning and trains for minutes.
pytestmark = pytest.mark.slow


def train_unchanged(config: str, tmp_path) -> list[dict[str, str]]:
    """Run a shipped config as is, as a user starts it (a fresh process), under the issue's 10-minute deadline; its
    per-step metrics rows."""
    result = run(
        "fit",
        "--config",
        config,
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
        timeout_s=600,
        fresh=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return step_metrics(tmp_path)


def assert_reward_climbs(steps: list[dict[str, str]], by: float = 0.3) -> None:
    """The mean reward of the last 5 steps is at least ``by`` above that of the first 5."""
    rewards = [float(step["train/reward"]) for step in steps]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= first + by, f"mean reward of the first 5 steps {first:.3f}, of the last 5 {last:.3f}"


def assert_goodput_adds_up(steps: list[dict[str, str]]) -> None:
    """Each fleet's goodput parts add up to its wall time, and the trainer's wall time is the sum of the step times
    RolloutMonitor logged (one clock: the refit record's)."""
    last = {key: float(value) for key, value in steps[-1].items() if key.startswith("goodput/") and value}
    for fleet, parts in (("trainer", TRAINER_PARTS), ("engine", EngineTime().parts())):
        total = sum(last[f"goodput/{fleet}/{part}_total_s"] for part in parts)
        assert total == pytest.approx(last[f"goodput/{fleet}/wall_total_s"], rel=0.02), fleet
    measured = sum(float(step["timing/train/total_step_time"]) for step in steps)
    assert last["goodput/trainer/wall_total_s"] == pytest.approx(measured, rel=0.02)
    assert last["goodput/trainer/productive_total_s"] > 0 and last["goodput/engine/trained_total_s"] > 0
    assert last["goodput/engine/trained_tokens_total"] > 0


@pytest.mark.exclusive  # its 10-minute bar is for the example alone on the 2-core box
@pytest.mark.timeout(900)  # the subprocess's own 600 s deadline is the bar; this only outlasts it
def test_the_tiny_example_visibly_learns(tmp_path) -> None:
    """The shipped default (async in_order, Megatron engine in a Ray actor): the reward climbs by >= 0.3.

    It takes about 6 minutes on 2 cores (0.31 s a step on 2026-12-01).
    """
    steps = train_unchanged(TINY, tmp_path)
    shipped = yaml.safe_load((REPO / TINY).read_text())
    assert len(steps) == shipped["grpo"]["max_num_steps"]
    assert max(float(step["train/staleness_max"]) for step in steps) == 1  # it really ran one version ahead
    assert_reward_climbs(steps)
    assert_goodput_adds_up(steps)
    # the optimizer ran the shipped schedule: the peak rate first, decaying to min_lr by the last step
    optimizer = shipped["policy"]["optimizer"]
    assert float(steps[0]["train/lr"]) == pytest.approx(optimizer["lr"])
    assert float(steps[-1]["train/lr"]) == pytest.approx(optimizer["min_lr"], rel=1e-3)


@pytest.mark.exclusive  # its 10-minute bar is for the example alone on the 2-core box
@pytest.mark.timeout(900)  # the subprocess's own 600 s deadline is the bar; this only outlasts it
def test_the_tiny_ppo_example_visibly_learns(tmp_path) -> None:
    """configs/ppo_tiny.yaml, unchanged (critic warm-up, then PPO with GAE): the same bar as GRPO."""
    steps = train_unchanged("configs/ppo_tiny.yaml", tmp_path)
    start = yaml.safe_load((REPO / "configs" / "ppo_tiny.yaml").read_text())["ppo"]["policy_training_start_step"]
    assert [float(s["train/policy_trained"]) for s in steps[: start + 1]] == [0.0] * start + [1.0]
    assert all(s["critic/explained_var"] != "" for s in steps)  # the critic trained and reported every step
    assert_reward_climbs(steps)


@pytest.mark.exclusive  # its 10-minute bar is for the example alone on the 2-core box
@pytest.mark.timeout(900)  # the subprocess's own 600 s deadline is the bar; this only outlasts it
def test_the_tiny_multiturn_example_visibly_learns(tmp_path) -> None:
    """configs/grpo_tiny_multiturn.yaml, unchanged (calculator conversations, about 1.5 minutes): the same bar."""
    steps = train_unchanged("configs/grpo_tiny_multiturn.yaml", tmp_path)
    assert max(float(step["train/staleness_max"]) for step in steps) == 1  # it really ran one version ahead
    assert_reward_climbs(steps)
    turns = [float(step["train/model_turns_mean"]) for step in steps[-5:]]
    assert min(turns) > 1.5, turns  # most trained conversations call the calculator, then answer


@pytest.mark.exclusive  # its 10-minute bar is for the example alone on the 2-core box
@pytest.mark.timeout(900)  # the subprocess's own 600 s deadline is the bar; this only outlasts it
def test_the_tiny_vllm_example_visibly_learns(tmp_path) -> None:
    """grpo_tiny_vllm.yaml, unchanged: the same bar as with the Megatron engine."""
    assert_reward_climbs(train_unchanged("configs/grpo_tiny_vllm.yaml", tmp_path))


@pytest.mark.exclusive  # its 10-minute bar is for the example alone on the 2-core box
@pytest.mark.timeout(900)  # the subprocess's own 600 s deadline is the bar; this only outlasts it
def test_the_tiny_distillation_example_visibly_learns(tmp_path) -> None:
    """configs/distill_tiny.yaml, unchanged (two teachers, full-vocabulary distillation, about 80 seconds): the
    student's reward rises by >= 0.3 on both tasks, each teacher's KL is logged and falls, and every trained row went
    to the teacher its dataset row names (the per-teacher routing counts are the dataset's)."""
    steps = train_unchanged("configs/distill_tiny.yaml", tmp_path)
    for alias in ("add", "mul"):
        assert_reward_climbs([{"train/reward": step[f"train/teacher_reward/{alias}"]} for step in steps])
        kl = [float(step[f"train/teacher_kl/{alias}"]) for step in steps]
        assert sum(kl[-5:]) < sum(kl[:5]) / 2, alias  # the student moved towards its teacher
        assert float(steps[-1][f"goodput/teacher/{alias}/busy_total_s"]) > 0  # each teacher: a fleet of its own
        assert float(steps[-1][f"goodput/teacher/{alias}/scored_tokens_total"]) > 0
    dataset = [json.loads(line) for line in (REPO / "examples" / "distill_tiny_prompts.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    assert [row["teacher"] for row in rows] == [dataset[row["prompt_index"]]["teacher"] for row in rows]
    routed = Counter(row["teacher"] for row in rows)  # 800 steps of 8 prompts: 32 whole epochs of the 200 rows
    assert routed == {
        alias: n * len(rows) // len(dataset) for alias, n in Counter(d["teacher"] for d in dataset).items()
    }
    assert [routed["add"], routed["mul"]] == [
        sum(float(step[f"train/teacher_rows/{alias}"]) for step in steps) for alias in ("add", "mul")
    ]


@pytest.mark.exclusive  # its 10-minute bar is for the example alone on the 2-core box
@pytest.mark.timeout(900)  # the subprocess's own 600 s deadline is the bar; this only outlasts it
def test_the_tiny_vlm_example_visibly_learns(tmp_path) -> None:
    """configs/grpo_tiny_vlm.yaml, unchanged (the tiny VLM on the built-in CLEVR, about 2 minutes): the reward rises
    by >= 0.3 from a warm start well below what reading the scenes earns (docs/vlm.md, "Running"), and the samples/
    record the report shows holds scenes and their answers at the first and the last step."""
    steps = train_unchanged("configs/grpo_tiny_vlm.yaml", tmp_path)
    shipped = yaml.safe_load((REPO / "configs" / "grpo_tiny_vlm.yaml").read_text())
    assert len(steps) == shipped["grpo"]["max_num_steps"]
    assert max(float(step["train/staleness_max"]) for step in steps) == 1  # it really ran one version ahead
    assert sum(float(step["train/reward"]) for step in steps[:5]) / 5 < 0.25  # the warm start leaves RL the climb
    assert_reward_climbs(steps)
    assert_scenes_with_answers(
        tmp_path, first=0, last=len(steps) - 1, answers=shipped["grpo"]["num_generations_per_prompt"]
    )


def assert_scenes_with_answers(run_dir: Path, *, first: int, last: int, answers: int) -> None:
    """samples/ holds the ``first`` and ``last`` steps (and some between), each with its 4 prompts (the default
    data.sample_log_prompts): a scene as a 32x32 PNG, the coded question after it, ``answers`` rewarded answers."""
    steps = sorted(int(path.stem.removeprefix("step_")) for path in (run_dir / "samples").glob("step_*.json"))
    assert steps[0] == first and steps[-1] == last, steps
    for step in (first, last):
        record = json.loads((run_dir / "samples" / f"step_{step:06d}.json").read_text())
        assert record["step"] == step and len(record["prompts"]) == 4
        for prompt in record["prompts"]:
            (image,) = prompt["images"]
            assert Image.open(run_dir / "samples" / image).size == (32, 32)
            assert prompt["prompt"].startswith("<image>") and len(prompt["answers"]) == answers
            assert {answer["reward"] for answer in prompt["answers"]} <= {0.0, 1.0}
