"""/v1/chat/completions over a real Megatron engine: the chat template's ids, the model's logprobs, the errors."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch

from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.models import load_policy, token_logprobs
from sc_lightning.rollout.multiturn.chat import CharChatTemplate, Message
from sc_lightning.rollout.serving.requests import BadRequest, parse_chat_request
from sc_lightning.rollout.serving.server import OpenAIEndpoint
from sc_lightning.testing.scripted_engine import ScriptedEngine
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import SamplingParams

TOKENIZER = CharTokenizer()
TEMPLATE = CharChatTemplate(TOKENIZER)
DEFAULTS = SamplingParams(max_new_tokens=4, temperature=1.0)


async def post_all(url: str, bodies: list[object]) -> list[tuple[int, dict]]:
    """POST each body to ``url``/chat/completions in turn; (status, JSON) of each."""
    answers = []
    async with aiohttp.ClientSession() as http:
        for body in bodies:
            async with http.post(f"{url}/chat/completions", json=body) as response:
                answers.append((response.status, await response.json()))
    return answers


@pytest.mark.usefixtures("model_parallel")
def test_chat_renders_the_template_and_returns_the_models_tokens_and_logprobs(tiny_dirs: dict) -> None:
    model = load_policy(str(tiny_dirs["a"]))[0].eval()
    first = [{"role": "user", "content": "12*34"}]
    second = [*first, {"role": "assistant", "content": "12*34"}, {"role": "tool", "content": "408"}]

    async def scenario() -> list[tuple[int, dict]]:
        engine = MegatronEngine.from_pretrained(str(tiny_dirs["a"]), stop_on_eos=False)
        endpoint = OpenAIEndpoint(engine, TOKENIZER, model_name="tiny-a", defaults=DEFAULTS, context_tokens=256)
        url = await endpoint.start()
        try:
            return await post_all(
                url,
                [
                    {"messages": first, "max_tokens": 5, "temperature": 0.7, "seed": 3},
                    {"messages": second, "max_tokens": 3, "seed": 4},
                    {"messages": [{"role": "critic", "content": "1"}]},
                    {"messages": second, "rollout_id": "ro-x"},  # this endpoint serves no external rollouts
                ],
            )
        finally:
            await endpoint.stop()
            await engine.shutdown()

    (s1, one), (s2, two), (s3, bad_role), (s4, no_rollouts) = asyncio.run(scenario())
    assert (s1, s2, s3, s4) == (200, 200, 400, 400)
    choice = one["choices"][0]
    assert choice["prompt_token_ids"] == TEMPLATE.render([Message("user", "12*34")], add_generation_prompt=True)
    assert choice["prompt_token_ids"] == [2, *TOKENIZER.encode("12*34=")]  # <bos> content "="
    assert choice["message"] == {"role": "assistant", "content": TOKENIZER.decode(tuple(choice["token_ids"]))}
    assert (one["object"], choice["finish_reason"], len(choice["token_ids"])) == ("chat.completion", "length", 5)
    assert one["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    assert (one["weight_version"], one["weight_version_end"], one["token_versions"]) == (0, 0, [0] * 5)
    sequence = torch.tensor([choice["prompt_token_ids"] + choice["token_ids"]])
    expected = token_logprobs(model, sequence, temperature=0.7)[0, 7:]
    torch.testing.assert_close(torch.tensor(choice["logprobs"]["token_logprobs"]), expected, atol=1e-4, rtol=0)
    # the tool message and the earlier assistant turn are rendered by the template: <bos>12*34=12*34<eos>408=
    assert two["choices"][0]["prompt_token_ids"] == [2, *TOKENIZER.encode("12*34=12*34"), 1, *TOKENIZER.encode("408=")]
    assert "messages[0].role" in bad_role["error"]["message"]
    assert "rollout_id" in no_rollouts["error"]["message"] and "env.name: external" in no_rollouts["error"]["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1], "JSON object"),
        ({}, "messages: give a non-empty list"),
        ({"messages": []}, "messages: give a non-empty list"),
        ({"messages": ["hi"]}, r"messages\[0\].role"),
        ({"messages": [{"role": "user", "content": 5}]}, r"messages\[0\].content"),
        ({"messages": [{"role": "user", "content": "1"}], "n": 3}, "n: only 1"),
        ({"messages": [{"role": "user", "content": "1"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "1"}], "rollout_id": 7}, "rollout_id: give the string"),
        (
            {"messages": [{"role": "user", "content": "1"}], "rollout_id": "r", "temperature": 0.5},
            "temperature: a call",
        ),
        ({"messages": [{"role": "user", "content": "a"}]}, "messages: "),  # not in the char tokenizer's alphabet
    ],
)
def test_bad_chat_requests_say_which_field(body: object, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_chat_request(body, TEMPLATE, DEFAULTS)


def test_text_parts_and_a_tool_calling_assistant_message_render() -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "1+"}, {"type": "text", "text": "2"}]},
            {"role": "assistant", "content": None},
        ],
        "rollout_id": "r",
        "temperature": 1.0,  # the run's: allowed
    }
    parsed = parse_chat_request(body, TEMPLATE, DEFAULTS)
    assert parsed.prompt_ids == (2, *TOKENIZER.encode("1+2="), 1)
    assert (parsed.rollout_id, parsed.seeded, parsed.sampling) == ("r", False, DEFAULTS)


def test_an_engine_failure_on_a_chat_request_is_a_503_naming_the_engine() -> None:
    async def scenario() -> list[tuple[int, dict]]:
        endpoint = OpenAIEndpoint(
            ScriptedEngine(fail_on=0), TOKENIZER, model_name="m", defaults=DEFAULTS, context_tokens=64
        )
        url = await endpoint.start()
        try:
            return await post_all(url, [{"messages": [{"role": "user", "content": "1+1"}]}])
        finally:
            await endpoint.stop()

    [(status, body)] = asyncio.run(scenario())
    assert status == 503
    assert body["error"] == {
        "message": "scripted: scripted failure on request 0",
        "type": "engine_error",
        "param": None,
        "code": None,
    }
