"""Multi-turn recovery end to end: calculator conversations from a .jsonl dataset, SIGKILLed mid-run and resumed.

Real CLI, megatron-core policy, the Megatron engine colocated (conversations are generated at the start of each
step, so a kill lands in the middle of them), a bundle after every step. Unfinished conversations are not sealed:
the resumed run regenerates them, and ``train_data.jsonl`` (rolled back with the bundle it resumes from) trains
every prompt exactly once, one whole group each, in contiguous steps.
"""

from __future__ import annotations

import csv
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.configs import REPO
from tests.helpers.recovery import a_new_bundle, command, run_until_done

pytestmark = pytest.mark.slow

PROMPTS, GROUP = 24, 4  # 6 steps of 4 groups x 4 conversations (tests/small_steps.yaml)
LAYERS = (
    REPO / "configs" / "grpo_tiny_multiturn.yaml",
    REPO / "configs" / "colocated.yaml",
    REPO / "tests" / "small_steps.yaml",
)


def write_calculator_dataset(path: Path) -> None:
    """PROMPTS raw ``a*b`` rows; data.apply_chat_template renders them as the conversations' user messages."""
    rng = random.Random(0)
    with path.open("w") as handle:
        for _ in range(PROMPTS):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            handle.write(json.dumps({"problem": f"{a}*{b}", "expected_answer": a * b}) + "\n")


def test_a_kill_during_conversations_resumes_training_every_prompt_once(tmp_path: Path) -> None:
    write_calculator_dataset(tmp_path / "prompts.jsonl")
    checkpoints = tmp_path / "checkpoints"
    argv = command(
        tmp_path, LAYERS,
        "--data.apply_chat_template", "true",
        "--data_plane.backend", "memory",
        "--checkpointing.save_period", "1",
    )  # fmt: skip

    progressed = a_new_bundle(checkpoints)
    kills, _ = run_until_done(argv, [(progressed, 0.3)], seed=21)
    assert kills == 1, "the kill did not land"

    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    per_prompt = Counter(row["prompt_index"] for row in rows)
    assert sorted(per_prompt) == list(range(PROMPTS)), "every prompt of the dataset was trained"
    assert set(per_prompt.values()) == {GROUP}, "exactly once: one whole group of conversations per prompt"
    assert len({row["group_id"] for row in rows}) == PROMPTS
    assert sorted({row["step"] for row in rows}) == list(range(PROMPTS // 4))
    logs = sorted(tmp_path.glob("lightning_logs/version_*/metrics.csv"))
    assert len(logs) == 2  # the killed run and the resumed one
    with logs[-1].open() as handle:
        turns = [float(row["train/model_turns_mean"]) for row in csv.DictReader(handle) if row["train/reward"]]
    assert turns and min(turns) > 1.5, turns  # the resumed run trained conversations: a call, then an answer
