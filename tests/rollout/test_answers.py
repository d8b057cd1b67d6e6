"""The answering pass ``validate`` and ``generate`` share, and what ``generate`` makes of it: the split's prompts, the
JSONL rows (rewards the environment gives the answer text), the summary and the examples.

The engine is the FAKE ScriptedEngine (no model here); the environment, datasets and tokenizer are real.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from sc_lightning.config.runtime import DataConfig
from sc_lightning.rollout.answer_sheet import AnswerSummary, answer_row, example_lines, split_prompts, write_rows
from sc_lightning.rollout.answers import Answer, AnswerError, AnswerSettings, answer_prompts
from sc_lightning.rollout.dataset_base import DatasetError
from sc_lightning.rollout.datasets import ArithmeticValidationSet
from sc_lightning.rollout.envs import ArithmeticEnvironment, answer_extractor
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.types import Generation, SamplingParams
from tests.helpers.scripts import TOKENIZER, Alternating

SETTINGS = AnswerSettings(SamplingParams(max_new_tokens=3), concurrency=3, seed=7)


class PeakEngine(ScriptedEngine):
    """FAKE engine (a ScriptedEngine) that records the most requests in flight at once and every seed it was given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inflight = self.peak = 0
        self.seeds: list[int | None] = []

    async def generate(self, prompt_token_ids: tuple[int, ...], sampling: SamplingParams) -> Generation:
        """The scripted completion, after one turn of the loop (so requests overlap)."""
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        self.seeds.append(sampling.seed)
        try:
            await asyncio.sleep(0)  # a turn of the loop, as a real engine's request takes: not a synchronisation
            return await super().generate(prompt_token_ids, sampling)
        finally:
            self.inflight -= 1


def answered(engine: ScriptedEngine, count: int = 10) -> tuple[list[Answer], list[str]]:
    """The pass over the first ``count`` arithmetic-val prompts, and the prompt ids ``on_answer`` saw."""
    prompts = list(ArithmeticValidationSet(TOKENIZER))[:count]
    seen: list[str] = []
    answers = asyncio.run(
        answer_prompts(
            prompts, engine, ArithmeticEnvironment(), TOKENIZER, SETTINGS, lambda a: seen.append(a.prompt.prompt_id)
        )
    )
    return answers, seen


def test_one_scored_answer_per_prompt_in_order_bounded_and_seeded_per_prompt() -> None:
    engine = PeakEngine(Alternating())  # each prompt is asked once: k = 0, the right sum
    answers, seen = answered(engine)
    prompts = list(ArithmeticValidationSet(TOKENIZER))[:10]
    assert [a.prompt for a in answers] == prompts and sorted(seen) == sorted(p.prompt_id for p in prompts)
    for answer in answers:
        assert answer.text == TOKENIZER.decode(answer.generation.token_ids)
        assert answer.score.reward == 1.0 == ArithmeticEnvironment().score(answer.prompt, answer.text)
    assert 1 < engine.peak <= SETTINGS.concurrency
    assert engine.seeds == [SETTINGS.sampling_for(p).seed for p in prompts]  # fixed by (seed, prompt)
    assert len(set(engine.seeds)) == 10


def test_a_failed_request_names_the_prompt_and_the_engine() -> None:
    with pytest.raises(AnswerError, match=r"answering prompt arithmetic-val-\d\d on engine 'scripted' failed: Engine"):
        answered(ScriptedEngine(Alternating(), fail_on=2))


def test_rows_carry_the_environments_reward_of_the_answer_text_and_the_answer_it_read() -> None:
    answers, _ = answered(ScriptedEngine(lambda prompt, call: TOKENIZER.encode(f"{call}=")), count=12)
    environment = ArithmeticEnvironment()
    rows = [answer_row(a, answer_extractor(environment)) for a in answers]
    for row, answer in zip(rows, answers, strict=True):
        assert row["reward"] == environment.score(answer.prompt, row["answer"])
        assert row["extracted_answer"] == row["answer"].rstrip("=")  # the leading integer
        assert row["prompt"] == answer.prompt.text and row["expected_answer"] == answer.prompt.answer
        assert row["answer_token_ids"] == list(answer.generation.token_ids)
        assert row["answer_tokens"] == len(answer.generation.token_ids) and row["prompt_tokens"] == 5
    assert 0 < sum(row["reward"] for row in rows) < len(rows)  # some calls happen to be the sum
    assert "extracted_answer" not in answer_row(answers[0])  # an environment that cannot tell: no key


def row(reward: float, tokens: int, finish: str = "stop", name: str = "p") -> dict[str, Any]:
    """A JSONL row with only what the summary and the examples read."""
    return {
        "prompt_id": name,
        "prompt": "1+1=",
        "answer": "2",
        "expected_answer": "2",
        "reward": reward,
        "answer_tokens": tokens,
        "finish_reason": finish,
    }


def test_the_summary_counts_rewards_correct_answers_and_lengths() -> None:
    rows = [row(1.0, 2), row(0.0, 4, "length"), row(0.5, 3), row(0.0, 1)]
    summary = AnswerSummary.of(rows)
    assert summary == AnswerSummary(answers=4, mean_reward=0.375, correct=2, mean_tokens=2.5, max_tokens=4, cut=1)
    assert summary.lines() == [
        "mean reward 0.375; correct 2/4 (50.0%, reward > 0)",
        "answer length: mean 2.5, max 4 tokens; 1 cut at max_new_tokens",
    ]


@pytest.mark.parametrize(
    ("rewards", "shown"),
    [
        ([1, 1, 1, 0, 0, 0], ["a", "b", "d", "e"]),  # two right, two wrong, in the rows' order
        ([1, 1, 1, 1, 1, 0], ["a", "b", "c", "f"]),  # one wrong: three right fill the rest
        ([0, 0, 0, 0, 0, 0], ["a", "b", "c", "d"]),
    ],
)
def test_examples_show_right_and_wrong_answers_alike(rewards: list[int], shown: list[str]) -> None:
    rows = [row(float(r), 2, name=name) for r, name in zip(rewards, "abcdef", strict=True)]
    lines = example_lines(rows, 4)
    assert [line.split("]")[0].strip(" [") for line in lines] == shown
    assert lines[0].startswith('  [a] "1+1=" -> "2"\n      reward ')


def test_the_default_split_is_the_validation_set_when_the_config_has_one(tmp_path: Path) -> None:
    val = split_prompts(DataConfig(), TOKENIZER, split=None, seed=7, count=5)
    assert (val.name, val.source) == ("val", "arithmetic-val")
    assert val.prompts == list(ArithmeticValidationSet(TOKENIZER))[:5]
    train = split_prompts(DataConfig(), TOKENIZER, split="train", seed=7, count=None)
    assert (train.name, train.source, len(train.prompts)) == ("train", "arithmetic", 512)
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{i}+1=", "expected_answer": i + 1}) + "\n" for i in range(3)))
    data = DataConfig(dataset_name=str(path))
    from_file = split_prompts(data, TOKENIZER, split=None, seed=7, count=10)
    assert (from_file.name, [p.text for p in from_file.prompts]) == ("train", ["0+1=", "1+1=", "2+1="])
    with pytest.raises(DatasetError, match="data.val_dataset_name is null"):
        split_prompts(data, TOKENIZER, split="val", seed=7, count=10)


def test_rows_are_written_as_json_lines(tmp_path: Path) -> None:
    rows = [row(1.0, 2, name="a"), row(0.0, 3, name="b")]
    path = tmp_path / "out" / "generations.jsonl"
    write_rows(path, rows)
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
