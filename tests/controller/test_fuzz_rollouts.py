"""Fuzz (hypothesis): dataset files with any rows, and environments that answer with anything, under random budgets.

A dataset file loads exactly its valid rows (ids dense) when its bad rows fit ``data.max_skipped_rows``, or fails
naming a bad row's file:line and the knob; the controller then trains only those prompts.

Whatever the environment returns — rewards, NaN, infinities, strings, None, masked scores, exceptions — the run
either trains every step it can (each between the floor and N groups, finite rewards only, no prompt twice) or
stops with an error naming a prompt; and the controller's books balance at every step boundary: buffer permits,
buffer slots, data-plane rows and the commit/select/evict/drop counters. The engine is the FAKE ScriptedEngine;
the controller, buffer, sampler, data plane, dataset and drop ledger are real.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sc_lightning.config.runtime import DataConfig
from sc_lightning.controller.api import RolloutPumpError
from sc_lightning.controller.build import build_controller
from sc_lightning.controller.controller import SingleController
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.dataset_base import DatasetError
from sc_lightning.rollout.envs.arithmetic import ArithmeticEnvironment
from sc_lightning.rollout.envs.base import RewardError, Score
from sc_lightning.rollout.prompt_files import FilePromptDataset
from sc_lightning.testing.scripted_engine import ScriptedEngine
from tests.helpers.drops import DATASET, drop_config, make
from tests.helpers.scripts import TOKENIZER, answer_correctly

OUTCOMES = ("ok", "nan", "inf", "string", "none", "masked", "reward_error", "key_error")
N, STEPS = 3, 4


class FuzzedEnvironment(ArithmeticEnvironment):
    """Answers call k for a prompt with the outcome a seeded hash picks: the same whatever the interleaving."""

    def __init__(self, seed: int, weights: dict[str, int]) -> None:
        super().__init__()
        self.seed, self.weights = seed, weights
        self.calls: dict[str, int] = {}

    def outcome(self, prompt_id: str, call: int) -> str:
        """The outcome of ``prompt_id``'s call number ``call``."""
        digest = hashlib.blake2b(f"{self.seed}/{prompt_id}/{call}".encode(), digest_size=8).digest()
        pick = int.from_bytes(digest, "little") % sum(self.weights.values())
        for outcome, weight in self.weights.items():
            if pick < weight:
                return outcome
            pick -= weight
        raise AssertionError("unreachable")

    def score(self, prompt, completion_text):
        """Whatever the seeded outcome says."""
        call = self.calls[prompt.prompt_id] = self.calls.get(prompt.prompt_id, -1) + 1
        outcome = self.outcome(prompt.prompt_id, call)
        verdicts = {
            "nan": float("nan"),
            "inf": -math.inf,
            "string": "1.0",
            "none": None,
            "masked": Score(0.5, mask_sample=True),
        }
        if outcome == "reward_error":
            raise RewardError("cannot verify")
        if outcome == "key_error":
            raise KeyError("answer")
        if outcome in verdicts:
            return verdicts[outcome]
        return super().score(prompt, completion_text)


def check_books(controller: SingleController) -> None:
    """The invariants that hold at a step boundary (after begin_refit: no claims, evicted rows deleted)."""
    stats = controller.stats()
    slots = controller.buffer.slots
    ready = [slot for slot in slots if slot.ready]
    assert len(slots) <= stats.buffer_permits_held <= controller.admission.buffer_permits.total
    assert stats.inflight <= controller.admission.inflight_permits.held <= controller.admission.inflight_permits.total
    assert stats.committed == stats.selected + stats.evicted + len(ready)
    stored = set(controller.data_plane.keys())
    assert {key for slot in ready for key in slot.meta.keys} <= stored  # no committed row lost


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    weights=st.fixed_dictionaries({o: st.integers(0, 6) for o in OUTCOMES}).filter(lambda w: w["ok"] > 0),
    data_attempts=st.integers(1, 3),
    skipped=st.integers(0, 4),
    fraction=st.sampled_from([0.3, 0.67, 1.0]),
    replace=st.booleans(),
    lookahead=st.integers(0, 1),
)
def test_any_environment_output_trains_or_fails_clearly_and_the_books_balance(
    seed: int, weights: dict[str, int], data_attempts: int, skipped: int, fraction: float, replace: bool, lookahead: int
) -> None:
    cfg = drop_config(
        n=N,
        lookahead=lookahead,
        max_data_attempts_per_prompt=data_attempts,
        max_skipped_prompts=skipped,
        min_step_batch_fraction=fraction,
        on_dropped_prompt="replace" if replace else "shrink",
        replacement_reserve_prompts=N if replace else 0,
    )
    controller = make(cfg, engine=ScriptedEngine(answer_correctly))
    environment = controller.manager.environment = FuzzedEnvironment(seed, weights)
    floor = max(1, math.ceil(N * fraction))
    trained: list[str] = []

    async def scenario() -> BaseException | None:
        await controller.start()
        try:
            for version in range(STEPS):
                step = []
                while len(step) < N:
                    chunk = await controller.select(version, 1, N - len(step), timeout_s=30)
                    if chunk is None:  # replacements used up the dataset (16 prompts)
                        assert not step and controller.stats().exhausted
                        return None
                    if not chunk:
                        break  # closed short
                    step += chunk
                assert floor <= len(step) <= N
                rows = controller.data_plane.get([k for g in step for k in g.keys], ["total_reward"])
                assert all(math.isfinite(float(r)) for r in rows["total_reward"])
                trained.extend(group.prompt_id for group in step)
                await controller.begin_refit(version + 1)
                check_books(controller)
                await controller.finish_refit(version + 1)
            return None
        except RolloutPumpError as failure:
            return failure
        finally:
            await controller.shutdown()

    failure = asyncio.run(scenario())
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert set(trained) <= {prompt.prompt_id for prompt in DATASET}
    stats = controller.stats()
    assert stats.dropped <= skipped
    if failure is not None:
        assert re.search(r"prompt arithmetic-\d+", str(failure)), str(failure)
    elif not stats.exhausted:
        assert len(trained) >= STEPS * floor
    bad = sum(w for o, w in weights.items() if o not in ("ok", "masked"))
    if bad == 0:  # a well-behaved environment never fails, drops or retries
        assert failure is None and (stats.data_failures, stats.dropped, len(trained)) == (0, 0, STEPS * N)
    assert environment.calls, "the environment was never called"


VALID_ROW = st.tuples(st.integers(0, 9), st.integers(0, 9)).map(
    lambda ab: ("valid", json.dumps({"problem": f"{ab[0]}+{ab[1]}=", "expected_answer": str(sum(ab))}))
)
BAD_ROW = st.one_of(
    st.text(alphabet='{}[]:,"abc 1', min_size=1, max_size=12).filter(lambda t: t.strip()).map(lambda t: ("bad", t)),
    st.just(("bad", json.dumps(["1+1=", "2"]))),
    st.just(("bad", json.dumps({"problem": "1+1="}))),
    st.just(("bad", json.dumps({"problem": 7, "expected_answer": "7"}))),
    st.just(("bad", json.dumps({"problem": "", "expected_answer": "0"}))),
    st.just(("bad", json.dumps({"problem": "1+" * 20 + "1=", "expected_answer": "21"}))),  # over max_prompt_length
    st.just(("bad", json.dumps({"problem": "hello", "expected_answer": "1"}))),  # not in the tokenizer's alphabet
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(st.one_of(VALID_ROW, BAD_ROW), min_size=1, max_size=14), budget=st.integers(0, 4))
def test_any_dataset_file_loads_its_valid_rows_or_fails_clearly_and_trains_only_them(
    tmp_path_factory, rows: list[tuple[str, str]], budget: int
) -> None:
    path = tmp_path_factory.mktemp("rows") / "prompts.jsonl"
    path.write_text("\n".join(line for _, line in rows) + "\n")
    valid = [json.loads(line)["problem"] for kind, line in rows if kind == "valid"]
    bad = len(rows) - len(valid)
    try:
        dataset = FilePromptDataset(path, TOKENIZER, DataConfig(max_prompt_length=16, max_skipped_rows=budget))
    except DatasetError as error:
        assert bad > budget or not valid
        assert ("data.max_skipped_rows" in str(error) and f"{path}:" in str(error)) or "holds no records" in str(error)
        return
    assert bad <= budget and [p.text for p in dataset] == valid and len(dataset.skipped_rows) == bad
    assert [p.prompt_id for p in dataset] == [f"math-{i:06d}" for i in range(len(valid))]  # dense over kept rows
    if len(dataset) < 2:
        return  # fewer prompts than a step: the prompt stream refuses it (tested elsewhere)
    controller = build_controller(
        drop_config(n=2),
        data_plane=MemoryDataPlane(),
        engine=ScriptedEngine(answer_correctly),
        environment=ArithmeticEnvironment(),
        tokenizer=TOKENIZER,
        dataset=dataset,
    )

    async def scenario() -> list[str]:
        await controller.start()
        try:
            step = await controller.select(0, 2, 2, timeout_s=30)
            await controller.begin_refit(1)
            check_books(controller)
            return [group.prompt_id for group in step]
        finally:
            await controller.shutdown()

    trained = asyncio.run(scenario())
    assert [dataset[int(pid.split("-")[1])].text for pid in trained] == valid[:2]  # unshuffled: the first two
