"""External agents' rollouts over the real endpoint, rollout manager and replay buffer: attribution and its errors.

The engine is the FAKE ScriptedEngine (it answers "7" then <eos>, so a turn re-renders to the tokens sampled); the
fit-level run with the real Megatron engine is tests/lightning/test_external_agents.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from sc_lightning.controller.api import ROW_FIELDS
from sc_lightning.controller.buffer import TQReplayBuffer
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.rollout.envs import ExternalRewards
from sc_lightning.rollout.external import ExternalRollouts, Transcript
from sc_lightning.rollout.manager import RolloutError, RolloutManager, RolloutSettings, RolloutTimeout, ServedPolicy
from sc_lightning.rollout.serving.server import OpenAIEndpoint
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import Generation, Prompt, SamplingParams

TOKENIZER = CharTokenizer()
SEVEN = (*TOKENIZER.encode("7"), TOKENIZER.eos_token_id)
SAMPLING = SamplingParams(max_new_tokens=3)


def prompt(a: int, b: int) -> Prompt:
    """The arithmetic dataset's prompt "a+b=" (ids <bos> a+b=)."""
    text = f"{a}+{b}="
    return Prompt(f"p{a}{b}", (TOKENIZER.bos_token_id, *TOKENIZER.encode(text)), text=text, answer=str(a + b))


class Agent:
    """A plain HTTP client of the endpoint: each method is one request, answering (status, JSON body)."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def next(self) -> tuple[int, Any]:
        async with self.http.get(f"{self.url}/rollouts/next", params={"wait_s": "5"}) as r:
            return r.status, (await r.json() if r.status == 200 else None)

    async def chat(self, rollout_id: str, messages: list[dict]) -> tuple[int, dict]:
        body = {"messages": messages, "rollout_id": rollout_id}
        async with self.http.post(f"{self.url}/chat/completions", json=body) as r:
            return r.status, await r.json()

    async def reward(self, rollout_id: str, reward: Any) -> tuple[int, dict]:
        async with self.http.post(f"{self.url}/rollouts/{rollout_id}/reward", json={"reward": reward}) as r:
            return r.status, await r.json()


@asynccontextmanager
async def serving(
    rollout_timeout_s: float | None = None, respond: Callable[[tuple[int, ...], int], tuple[int, ...]] | None = None
) -> AsyncIterator[tuple[RolloutManager, Agent]]:
    """A rollout manager whose samples come from external agents, the endpoint serving them, and an agent."""
    engine = ScriptedEngine(respond or (lambda prompt, call: SEVEN))
    rollouts = ExternalRollouts(max_total_tokens=32, engine_name=engine.name)
    settings = RolloutSettings(2, SAMPLING, None, None, rollout_timeout_s=rollout_timeout_s)
    buffer = TQReplayBuffer(MemoryDataPlane())
    manager = RolloutManager(ServedPolicy(engine), ExternalRewards(), TOKENIZER, buffer, settings)
    manager.sample_source = rollouts
    endpoint = OpenAIEndpoint(
        engine, TOKENIZER, model_name="m", defaults=SAMPLING, context_tokens=32, rollouts=rollouts
    )
    url = await endpoint.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield manager, Agent(http, url)
    finally:
        await endpoint.stop()


def test_calls_are_attributed_and_every_misuse_is_refused_naming_the_rollout() -> None:
    user = [{"role": "user", "content": "1+2="}]

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with serving() as (manager, agent):
            group = asyncio.create_task(manager.generate_and_push(prompt(1, 2)))
            seen["unknown reward"] = await agent.reward("ro-nope", 1.0)
            seen["unknown call"] = await agent.chat("ro-nope", user)
            status, first = await agent.next()
            assert status == 200
            seen["claimed"] = first
            a = first["rollout_id"]
            b = a.rsplit("-", 1)[0] + "-" + str(int(a.rsplit("-", 1)[1]) + 1)  # the group's other, unclaimed rollout
            seen["unclaimed reward"] = await agent.reward(b, 1.0)
            seen["unclaimed call"] = await agent.chat(b, first["messages"])
            seen["other prompt"] = await agent.chat(a, [{"role": "user", "content": "1+3="}])
            seen["bad reward"] = await agent.reward(a, float("nan"))
            _, one = await agent.chat(a, first["messages"])
            turn = {"role": "assistant", "content": one["choices"][0]["message"]["content"]}
            rewritten = [*first["messages"], {"role": "assistant", "content": "8"}, {"role": "tool", "content": "3"}]
            seen["rewritten"] = await agent.chat(a, rewritten)
            _, two = await agent.chat(a, [*first["messages"], turn, {"role": "tool", "content": "3"}])
            seen["turns"] = (one, two)
            seen["reward a"] = await agent.reward(a, 0.5)
            seen["call after reward"] = await agent.chat(a, first["messages"])
            seen["second reward"] = await agent.reward(a, 1.0)
            status, second = await agent.next()
            assert second["rollout_id"] == b
            await agent.chat(b, second["messages"])
            seen["reward b"] = await agent.reward(b, 1.0)
            meta = await group
            seen["rows"] = manager.sink.data_plane.get(list(meta.keys), list(ROW_FIELDS))
        return seen

    seen = asyncio.run(scenario())
    status, body = seen["unknown reward"]
    assert status == 404 and "rollout ro-nope is unknown" in body["error"]["message"]
    assert seen["unknown call"][0] == 404
    claimed = seen["claimed"]
    assert claimed["prompt_token_ids"] == list(prompt(1, 2).token_ids) and claimed["answer"] == "3"
    assert claimed["messages"] == [{"role": "user", "content": "1+2="}]
    for key in ("unclaimed reward", "unclaimed call"):
        status, body = seen[key]
        assert status == 409 and "is not claimed" in body["error"]["message"], key
    status, body = seen["other prompt"]
    assert status == 409 and f"rollout {claimed['rollout_id']}:" in body["error"]["message"]
    assert "differs from the group's prompt at token 3" in body["error"]["message"]
    assert seen["bad reward"][0] == 400 and "reward: give a finite number" in seen["bad reward"][1]["error"]["message"]
    status, body = seen["rewritten"]
    assert status == 409 and "messages[1] differs from the model's turn as returned" in body["error"]["message"]
    one, two = seen["turns"]
    assert one["choices"][0]["token_ids"] == list(SEVEN) and one["rollout_id"] == claimed["rollout_id"]
    # the template's "=" after the prompt is an environment token; so is the tool message "3="
    assert one["choices"][0]["prompt_token_ids"] == [*prompt(1, 2).token_ids, *TOKENIZER.encode("=")]
    assert two["choices"][0]["prompt_token_ids"] == one["choices"][0]["prompt_token_ids"] + [*SEVEN, 6, 16]
    assert seen["reward a"] == (
        200,
        {"rollout_id": claimed["rollout_id"], "reward": 0.5, "model_calls": 2, "completion_tokens": 7,
         "trained_tokens": 4},
    )  # fmt: skip
    for key in ("call after reward", "second reward"):
        status, body = seen[key]
        assert status == 409 and "is closed: its reward was posted" in body["error"]["message"], key
    rows = seen["rows"]
    assert [r.item() for r in rows["total_reward"]] == [0.5, 1.0]
    length = int(rows["prompt_lengths"][0])
    assert rows["input_ids"][0][length:].tolist() == [16, *SEVEN, 6, 16, *SEVEN]
    assert rows["token_mask"][0][length:].tolist() == [0, 1, 1, 0, 0, 1, 1]


def test_a_rollout_never_finished_fails_its_group_at_the_deadline_and_closes() -> None:
    async def scenario() -> tuple[BaseException, tuple[int, dict], int]:
        async with serving(rollout_timeout_s=0.5) as (manager, agent):
            group = asyncio.create_task(manager.generate_and_push(prompt(2, 2)))
            _, claimed = await agent.next()
            failure = await asyncio.gather(group, return_exceptions=True)
            late = await agent.chat(claimed["rollout_id"], claimed["messages"])
            return failure[0], late, len(manager.sink.slots)

    failure, (status, body), slots = asyncio.run(scenario())
    assert isinstance(failure, RolloutTimeout) and "prompt p22" in str(failure)
    assert status == 409 and "is closed: its prompt group ended" in body["error"]["message"]
    assert slots == 0  # nothing left reserved in the buffer


def test_a_reward_before_any_model_call_fails_the_group_as_a_data_failure() -> None:
    async def scenario() -> tuple[BaseException, tuple[int, dict], str, dict]:
        async with serving() as (manager, agent):
            group = asyncio.create_task(manager.generate_and_push(prompt(3, 4)))
            _, claimed = await agent.next()
            answer = await agent.reward(claimed["rollout_id"], 1.0)
            failure = await asyncio.gather(group, return_exceptions=True)
            return failure[0], answer, claimed["rollout_id"], manager.failures

    failure, (status, body), rollout_id, failures = asyncio.run(scenario())
    assert isinstance(failure, RolloutError) and not isinstance(failure, RolloutTimeout)
    assert f"prompt p34 (group {failure.group_id}" in str(failure) and f"rollout {rollout_id}" in str(failure)
    assert (
        status == 409
        and f"rollout {rollout_id} got a reward before any model call sampled a token" in body["error"]["message"]
    )
    assert failures["data"] == 1


def test_a_transcript_keeps_the_engines_per_token_versions_and_marks_what_came_between() -> None:
    transcript = Transcript((2, 5))
    transcript.add_call((2, 5, 16), Generation((7, 1), (-0.1, -0.2), "stop", 3, (3, 4)))
    assert transcript.mismatch((2, 5, 16, 7)) is not None  # stops short of the last turn's tokens
    assert transcript.mismatch((2, 5, 16, 7, 1, 9, 16)) is None
    transcript.add_call((2, 5, 16, 7, 1, 9, 16), Generation((8,), (-0.3,), "length", 4))
    generation = transcript.generation()
    assert generation.token_ids == (16, 7, 1, 9, 16, 8)
    assert generation.trainable == (False, True, True, False, False, True)
    assert generation.logprobs == (0.0, -0.1, -0.2, 0.0, 0.0, -0.3)
    # a refit landed inside the first turn (versions 3, 4); tokens between turns carry the version before them
    assert generation.token_versions == (3, 3, 4, 4, 4, 4)
    assert (generation.weight_version, generation.finish_reason) == (3, "length")


def test_a_chat_turn_continues_from_the_sampled_tokens_when_its_text_does_not_render_back_to_them() -> None:
    """A turn cut at max_tokens with a pad id inside decodes to "77": the next call still appends to the exact
    tokens, closing the turn with the template's <eos> (an environment token) before the tool message."""
    lossy = (10, TOKENIZER.pad_token_id, 10)

    async def scenario() -> tuple[dict, dict, dict]:
        async with serving(respond=lambda prompt, call: lossy) as (manager, agent):
            group = asyncio.create_task(manager.generate_and_push(prompt(1, 1)))
            answers = []
            for _ in range(2):
                _, claimed = await agent.next()
                messages = claimed["messages"]
                _, one = await agent.chat(claimed["rollout_id"], messages)
                turn = one["choices"][0]["message"]
                _, two = await agent.chat(claimed["rollout_id"], [*messages, turn, {"role": "tool", "content": "2"}])
                answers.append((one, two, await agent.reward(claimed["rollout_id"], 1.0)))
            meta = await group
            rows = manager.sink.data_plane.get(list(meta.keys), list(ROW_FIELDS))
        return answers[0][0], answers[0][1], rows

    one, two, rows = asyncio.run(scenario())
    assert one["choices"][0]["message"]["content"] == "77"  # the pad id decodes to nothing
    first = one["choices"][0]
    tail = [TOKENIZER.eos_token_id, *TOKENIZER.encode("2=")]
    assert two["choices"][0]["prompt_token_ids"] == first["prompt_token_ids"] + list(lossy) + tail
    length = int(rows["prompt_lengths"][0])
    assert rows["input_ids"][0][length:].tolist() == [16, *lossy, *tail, *lossy]
    assert rows["token_mask"][0][length:].tolist() == [0, 1, 1, 1, 0, 0, 0, 1, 1, 1]


def test_a_completions_call_with_token_ids_is_attributed_too() -> None:
    async def scenario() -> tuple[int, dict, dict]:
        async with serving() as (manager, agent):
            group = asyncio.create_task(manager.generate_and_push(prompt(5, 1)))
            for _ in range(2):
                _, claimed = await agent.next()
                body = {"prompt": claimed["prompt_token_ids"], "rollout_id": claimed["rollout_id"], "seed": 5}
                async with agent.http.post(f"{agent.url}/completions", json=body) as r:
                    status, answer = r.status, await r.json()
                await agent.reward(claimed["rollout_id"], 0.25)
            meta = await group
            return status, answer, manager.sink.data_plane.get(list(meta.keys), list(ROW_FIELDS))

    status, answer, rows = asyncio.run(scenario())
    assert status == 200 and answer["choices"][0]["text"] == "7"
    length = int(rows["prompt_lengths"][0])
    assert rows["input_ids"][0][length:].tolist() == list(SEVEN)  # no environment token: the prompt ids as given
    assert rows["token_mask"][0][length:].tolist() == [1, 1]


@pytest.mark.parametrize("wait_s", ["soon", "0"])
def test_the_long_poll_answers_204_when_no_rollout_comes_and_400_for_a_bad_wait(wait_s: str) -> None:
    async def scenario() -> int:
        async with serving() as (_, agent), agent.http.get(f"{agent.url}/rollouts/next?wait_s={wait_s}") as r:
            return r.status

    assert asyncio.run(scenario()) == (400 if wait_s == "soon" else 204)
