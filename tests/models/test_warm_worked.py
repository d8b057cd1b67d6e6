"""The worked-arithmetic warm start: its rows are what the verifier rewards, its batches keep their token budget, its
reward estimate is the probability of sampling each answer, and a recipe of it builds, stops and caches."""

from __future__ import annotations

import itertools
import logging
import math
import random
from pathlib import Path

import pytest
import torch

from sc_lightning.models.logprobs import token_logprobs
from sc_lightning.models.megatron import build_gpt_model, load_policy
from sc_lightning.models.spec import BUILTIN_SPECS, builtin_spec
from sc_lightning.models.warm_start import WARM_STARTS, WarmRecipe, resolve_model_name
from sc_lightning.models.warm_worked import (
    MasterAdamW,
    WorkedBudget,
    expected_reward,
    length_batches,
    train_worked,
    warm_lr_factor,
    worked_rows,
)
from sc_lightning.rollout.envs import WorkedArithmeticEnvironment
from sc_lightning.tasks.worked_arithmetic import draw_problems
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import Prompt

pytestmark = pytest.mark.usefixtures("model_parallel")
TOKENIZER = CharTokenizer()


def test_every_warm_start_row_is_a_solution_the_verifier_rewards() -> None:
    """The warm start teaches exactly what RL rewards: each row's answer part scores 1, and ends in the eos."""
    problems = draw_problems(300, "rows")
    rows = worked_rows(problems, TOKENIZER)
    env = WorkedArithmeticEnvironment()
    for problem, ids, start in zip(problems, rows.ids, rows.answer_start, strict=True):
        prompt = Prompt("p", tuple(ids[:start]), text=TOKENIZER.decode(ids[:start]), answer=problem.answer)
        assert prompt.token_ids[0] == TOKENIZER.bos_token_id and prompt.text == problem.prompt
        assert ids[-1] == TOKENIZER.eos_token_id and TOKENIZER.eos_token_id not in ids[start:-1]
        assert env.score(prompt, TOKENIZER.decode(ids[start:])) == 1.0


def test_length_batches_hold_every_row_once_within_the_token_budget() -> None:
    lengths = [random.Random(i).randint(10, 2050) for i in range(500)]
    batches = length_batches(lengths, max_tokens=8192)
    assert sorted(i for batch in batches for i in batch) == list(range(500))
    for batch in batches:
        widest = max(lengths[i] for i in batch)
        assert len(batch) * widest <= 8192 or len(batch) == 1
        assert [lengths[i] for i in batch] == sorted(lengths[i] for i in batch)


def test_the_expected_reward_is_the_mean_chance_of_writing_each_line_prefix() -> None:
    """Row by row, unpadded: for each of the answer's lines, exp of the summed log-probabilities of the answer tokens
    up to that line's separator; their mean, averaged over rows; the batched, padded estimate must equal it."""
    model = build_gpt_model(builtin_spec("builtin:tiny"), seed=0)
    problems = [p for p in draw_problems(64, "reward") if len(p.lines) <= 30][:12]
    rows = worked_rows(problems, TOKENIZER)
    alone = []
    with torch.no_grad():
        for problem, ids, start in zip(problems, rows.ids, rows.answer_start, strict=True):
            logprobs = token_logprobs(model, torch.tensor([ids]))[0, start:].tolist()
            assert len(logprobs) == 5 * len(problem.lines)  # four digits and a separator a line
            prefixes = [math.exp(sum(logprobs[: 5 * (j + 1)])) for j in range(len(problem.lines))]
            alone.append(sum(prefixes) / len(prefixes))
    assert expected_reward(model, rows, TOKENIZER.PAD, batch_tokens=600) == pytest.approx(sum(alone) / len(alone))
    assert model.training  # left as it was found


def test_a_worked_recipe_trains_within_its_token_budget_and_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Through resolve_model_name, as a run builds it: a budget of a few steps ends the training (the target is
    out of reach), the trained model is saved where fit loads it, and a second call finds it cached."""
    monkeypatch.setitem(
        BUILTIN_SPECS, "builtin:tiny-long", builtin_spec("builtin:tiny").replace(max_position_embeddings=2304)
    )
    budget = WorkedBudget(max_tokens=4096, batch_tokens=2100, warmup_steps=1, held_out=2, target_reward=0.9, pool=16)
    recipe = WarmRecipe("builtin:tiny-long", lr=1e-3, check_every=1, task="worked_arithmetic", budget=budget)
    monkeypatch.setitem(WARM_STARTS, "builtin:tiny-long-worked", recipe)
    with caplog.at_level(logging.INFO, logger="sc_lightning.models.warm_worked"):
        path = resolve_model_name("builtin:tiny-long-worked", seed=3, cache_dir=tmp_path)
    checks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("worked warm start: step")]
    assert [c.split(",")[0] for c in checks] == [f"worked warm start: step {i + 1}" for i in range(len(checks))]
    assert 2 <= len(checks) <= 4 and any("token budget (4096) ran out" in r.getMessage() for r in caplog.records)
    trained, spec, _ = load_policy(path, seed=3)
    fresh = build_gpt_model(spec, seed=3)
    assert spec.max_position_embeddings == 2304
    assert not torch.equal(trained.state_dict()["output_layer.weight"], fresh.state_dict()["output_layer.weight"])
    assert resolve_model_name("builtin:tiny-long-worked", seed=3, cache_dir=tmp_path) == path


def test_a_target_within_reach_stops_the_training_at_its_first_check(caplog: pytest.LogCaptureFixture) -> None:
    model = build_gpt_model(builtin_spec("builtin:tiny"), seed=0)
    budget = WorkedBudget(max_tokens=10**6, batch_tokens=2100, held_out=2, target_reward=0.0, pool=16)
    with caplog.at_level(logging.INFO, logger="sc_lightning.models.warm_worked"):
        reward = train_worked(model, builtin_spec("builtin:tiny"), lr=1e-3, seed=0, check_every=2, budget=budget)
    checks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("worked warm start: step")]
    assert len(checks) == 1 and checks[0].startswith("worked warm start: step 2,"), checks
    assert 0.0 <= reward <= 1.0


def test_the_shipped_recipe_warms_the_300m_model_within_a_bounded_budget() -> None:
    recipe = WARM_STARTS["builtin:medium-worked"]
    assert recipe.base == "builtin:medium" and recipe.task == "worked_arithmetic" and recipe.budget is not None
    assert recipe.budget.max_tokens <= 24_000_000 and 0.2 <= recipe.budget.target_reward <= 0.5


def test_the_warm_rate_warms_up_then_follows_a_cosine_to_its_floor_over_the_budget() -> None:
    budget = WorkedBudget(max_tokens=100 * 1000, batch_tokens=1000, warmup_steps=10, min_lr_ratio=0.1)
    factors = [warm_lr_factor(step, budget) for step in range(200)]
    assert factors[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factors[10] == pytest.approx(1.0) and factors[55] == pytest.approx(0.55)  # half-way down the cosine
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))
    assert factors[100:] == pytest.approx([0.1] * 100)  # the budget's 100 steps spent: the floor holds


def test_the_warm_optimizer_clips_the_global_gradient_norm() -> None:
    model = torch.nn.Linear(4, 4)
    optimizer = MasterAdamW(model, lr=1e-3, budget=WorkedBudget(clip_grad=0.5))
    (model(torch.ones(2, 4)) * 1e6).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m.grad) for m in optimizer.masters]))
    assert norm == pytest.approx(0.5, rel=1e-4)
    assert all(p.grad is None for p in model.parameters())
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
