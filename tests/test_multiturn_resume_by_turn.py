"""A multi-turn run with token capture, SIGKILLed mid-conversation, resumes each conversation after its sealed turn.

Real CLI, megatron-core policy, the Megatron engine in its own Ray actor (one version ahead), a bundle after every
step. The calculator environment (tests/helpers/stalling_env.py) stalls the second step of every conversation of the
second and third steps' prompts, so their first turns (sampled with weights 0 while step 0 trains, or, for the third
step's, sometimes after the first refit with weights 1) are sealed when the first bundle (weights 1) is cut. The
run is killed then and restarted with the same command: the trained rows hold the sealed turns' tokens, logprobs and
versions as the bundle recorded them — generated again they would carry version 1 — and every prompt is trained once.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from sc_lightning.checkpoint.atomic import complete_bundles
from sc_lightning.checkpoint.bundle import RECOVERY_FILE
from sc_lightning.controller.recovery import PendingGroup
from sc_lightning.types import Generation
from tests.helpers.configs import REPO
from tests.helpers.recovery import command, run_until_done

pytestmark = pytest.mark.slow

PROMPTS, GROUP = 12, 4  # 3 steps of 4 groups x 4 conversations (tests/small_steps.yaml)
LAYERS = (REPO / "configs" / "grpo_tiny_multiturn.yaml", REPO / "tests" / "small_steps.yaml")
CALLBACKS = [{"class_path": f"tests.helpers.callbacks.{name}"} for name in ("CutAfterAStall", "TrainedTokens")]


def write_calculator_dataset(path: Path) -> None:
    """PROMPTS distinct raw ``a*b`` rows; data.apply_chat_template renders them as the conversations' user messages."""
    rng = random.Random(0)
    pairs = rng.sample([(a, b) for a in range(10, 100) for b in range(10, 100)], PROMPTS)
    with path.open("w") as handle:
        handle.writelines(json.dumps({"problem": f"{a}*{b}", "expected_answer": a * b}) + "\n" for a, b in pairs)


def float32(values: list[float]) -> list[float]:
    """``values`` as the data plane stores logprobs."""
    return torch.tensor(values, dtype=torch.float32).tolist()


def kept(rows: list[dict], prompt_ids: tuple[int, ...], generation: Generation) -> bool:
    """Whether a trained row of the prompt continues with ``generation``'s tokens, logprobs and versions."""
    start, end = len(prompt_ids), len(prompt_ids) + len(generation.token_ids)
    return any(
        tuple(row["input_ids"][:start]) == prompt_ids
        and tuple(row["input_ids"][start:end]) == generation.token_ids
        and row["logprobs"][start:end] == float32(list(generation.logprobs))
        and tuple(row["token_versions"][start:end]) == generation.token_versions
        for row in rows
    )


def test_a_kill_mid_conversation_resumes_after_the_sealed_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_calculator_dataset(tmp_path / "prompts.jsonl")
    stall, checkpoints = tmp_path / "stall", tmp_path / "checkpoints"
    stall.touch()
    monkeypatch.setenv("SC_TEST_STALL", str(stall))
    monkeypatch.setenv("SC_TEST_STALL_FROM", str(GROUP))  # the prompts of steps 1 and 2
    argv = command(
        tmp_path, LAYERS,
        "--data.apply_chat_template", "true",
        "--data.shuffle", "false",
        "--data_plane.backend", "memory",
        "--async_rl.max_buffered_rollouts", "8",
        "--async_rl.max_inflight_prompts", "8",
        "--checkpointing.save_period", "1",
        "--token_capture.enabled", "true",
        "--env.name", "tests.helpers.stalling_env:StallingCalculator",
        "--env.max_turns", "3",
        "--env.max_conversation_tokens", "48",
        f"--trainer.callbacks={json.dumps(CALLBACKS)}",
    )  # fmt: skip
    pending: list[PendingGroup] = []

    def first_bundle():  # noqa: ANN202
        def written() -> bool:  # read what the restart resumes from, then let the restarted run's episodes answer
            bundles = complete_bundles(checkpoints)
            if bundles:
                saved = torch.load(bundles[0][1] / RECOVERY_FILE, weights_only=True)
                pending.extend(PendingGroup.from_dict(entry, capture=True) for entry in saved)
                stall.unlink()
            return bool(bundles)

        return written

    kills, stderrs = run_until_done(argv, [(first_bundle, 0.0)], seed=5)
    assert kills == 1, "the kill did not land"
    assert any("resuming from" in line and "step_1" in line for line in stderrs[-1].splitlines()), stderrs[-1][-2000:]

    sealed = [
        (entry.prompt.token_ids, turn.generation)
        for entry in pending
        for record in (entry.conversations or {}).values()
        if record.generation is None
        for turn in record.turns
    ]
    finished = [
        (entry.prompt.token_ids, record.generation)
        for entry in pending
        for record in (entry.conversations or {}).values()
        if record.generation is not None
    ]
    assert sealed, "no conversation was cut with a sealed turn"
    # the first turns of the second step's prompts are sampled with weights 0 while step 0 trains; the third step's
    # may start after the first refit (weights 1), as they did once under load. A turn of weights 0 shows the resume
    # kept it (generated again it would carry weights 1); every sealed turn is checked below either way
    versions = {generation.weight_version for _, generation in sealed}
    assert 0 in versions and versions <= {0, 1}, versions

    lines = (tmp_path / "trained_tokens.jsonl").read_text().splitlines()
    resumed = [row for row in map(json.loads, lines) if row["step"] >= 1]
    for prompt_ids, generation in sealed + finished:
        assert kept(resumed, prompt_ids, generation), f"a sealed turn of {prompt_ids} was not trained as recorded"

    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    per_prompt = Counter(row["prompt_index"] for row in rows)
    assert sorted(per_prompt) == list(range(PROMPTS)), "every prompt of the dataset was trained"
    assert set(per_prompt.values()) == {GROUP}, "exactly once: one whole group of conversations per prompt"
    assert len({row["group_id"] for row in rows}) == PROMPTS
    assert sorted({row["step"] for row in rows}) == list(range(PROMPTS // GROUP))
