"""The OpenAI-compatible completions endpoint over a real Megatron engine: ids, logprobs, versions, errors."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import torch

from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.models import export_hf_weights, load_policy, token_logprobs
from sc_lightning.rollout.serving.requests import BadRequest, parse_completion_request
from sc_lightning.rollout.serving.server import STOP_GRACE_S, OpenAIEndpoint
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import SamplingParams

pytestmark = pytest.mark.usefixtures("model_parallel")
TOKENIZER = CharTokenizer()
DEFAULTS = SamplingParams(max_new_tokens=4, temperature=1.0)


def test_endpoint_serves_ids_logprobs_and_the_weight_version(tiny_dirs: dict) -> None:
    model_a = load_policy(str(tiny_dirs["a"]))[0].eval()
    model_b, spec_b, _ = load_policy(str(tiny_dirs["b"]))
    model_b.eval()

    async def scenario() -> tuple[dict, dict, dict, dict, dict]:
        engine = MegatronEngine.from_pretrained(str(tiny_dirs["a"]), stop_on_eos=False)
        endpoint = OpenAIEndpoint(engine, TOKENIZER, model_name="tiny-a", defaults=DEFAULTS, context_tokens=256)
        url = await endpoint.start()
        assert url.startswith("http://127.0.0.1:")
        try:
            async with aiohttp.ClientSession() as http:

                async def post(body: dict) -> tuple[int, dict]:
                    async with http.post(f"{url}/completions", json=body) as response:
                        return response.status, await response.json()

                _, text = await post({"prompt": "1+2=", "max_tokens": 6, "temperature": 0.7, "seed": 1})
                _, ids = await post({"prompt": [2, 4, 13, 5, 16], "max_tokens": 6, "temperature": 0.7, "seed": 1})
                await engine.update_weights(export_hf_weights(model_b, spec_b), version=3)
                _, after = await post({"prompt": "1+2=", "max_tokens": 5, "temperature": 0.0})
                status, bad = await post({"prompt": [], "max_tokens": 3})
                assert status == 400
                async with http.get(f"{url}/models") as response:
                    models = await response.json()
        finally:
            await endpoint.stop()
            await endpoint.stop()  # idempotent
            await engine.shutdown()
        return text, ids, after, bad, models

    text, ids, after, bad, models = asyncio.run(scenario())
    choice = text["choices"][0]
    assert choice["prompt_token_ids"] == [2, 4, 13, 5, 16]  # bos + "1+2=", as the dataset encodes prompts
    assert ids["choices"][0]["token_ids"] == choice["token_ids"]  # same prompt, same seed: same sample
    assert choice["text"] == TOKENIZER.decode(tuple(choice["token_ids"]))
    sequence = torch.tensor([choice["prompt_token_ids"] + choice["token_ids"]])
    expected = token_logprobs(model_a, sequence, temperature=0.7)[0, 5:]
    torch.testing.assert_close(torch.tensor(choice["logprobs"]["token_logprobs"]), expected, atol=1e-4, rtol=0)
    assert (text["weight_version"], text["weight_version_end"]) == (0, 0)
    assert (after["weight_version"], after["weight_version_end"]) == (3, 3)
    assert after["token_versions"] == [3] * len(after["choices"][0]["token_ids"])
    greedy = after["choices"][0]
    logits_b = token_logprobs(model_b, torch.tensor([greedy["prompt_token_ids"] + greedy["token_ids"]]))[0, 5:]
    torch.testing.assert_close(torch.tensor(greedy["logprobs"]["token_logprobs"]), logits_b, atol=1e-4, rtol=0)
    assert text["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    assert "prompt" in bad["error"]["message"]
    assert models["data"] == [{"id": "tiny-a", "object": "model"}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1, 2], "JSON object"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": [1, True]}, "prompt"),
        ({"prompt": "1+1=", "n": 2}, "n: only 1"),
        ({"prompt": "1+1=", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "1+1=", "temperature": "hot"}, "temperature: give a finite number"),
    ],
)
def test_bad_requests_say_which_field(body: object, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_completion_request(body, TOKENIZER, DEFAULTS)


def test_an_engine_failure_is_a_503_naming_the_engine() -> None:
    from sc_lightning.testing.scripted_engine import ScriptedEngine

    async def scenario() -> tuple[int, dict]:
        endpoint = OpenAIEndpoint(
            ScriptedEngine(fail_on=0), TOKENIZER, model_name="m", defaults=DEFAULTS, context_tokens=64
        )
        url = await endpoint.start()
        try:
            async with aiohttp.ClientSession() as http, http.post(f"{url}/completions", json={"prompt": "1+1="}) as r:
                return r.status, await r.json()
        finally:
            await endpoint.stop()

    status, body = asyncio.run(scenario())
    assert status == 503
    assert body["error"] == {
        "message": "scripted: scripted failure on request 0",
        "type": "engine_error",
        "param": None,
        "code": None,
    }


def test_stop_closes_a_call_still_waiting_on_the_engine_within_its_grace() -> None:
    """A call in flight when the endpoint stops (its engine stood down for training, say) is not left hanging for
    aiohttp's default minute (twice over): ``stop`` returns within seconds and the caller's connection is closed."""
    from sc_lightning.testing.scripted_engine import ScriptedEngine

    async def scenario() -> tuple[float, BaseException | None]:
        engine = ScriptedEngine(gated=True)  # a fake whose requests wait until released: none is
        endpoint = OpenAIEndpoint(engine, TOKENIZER, model_name="m", defaults=DEFAULTS, context_tokens=64)
        url = await endpoint.start()
        async with aiohttp.ClientSession() as http:
            call = asyncio.create_task(http.post(f"{url}/completions", json={"prompt": "1+1="}))
            await engine.wait_for_requests(1, timeout_s=30)
            started = time.monotonic()
            await endpoint.stop()
            stopping_s = time.monotonic() - started
            try:
                await asyncio.wait_for(call, 10)
            except aiohttp.ClientError as err:
                return stopping_s, err
            return stopping_s, None

    stopping_s, error = asyncio.run(scenario())
    assert stopping_s < 2 * STOP_GRACE_S + 1.5  # aiohttp: the grace, then as long for the cancelled call to end
    assert isinstance(error, aiohttp.ServerDisconnectedError), error


def test_a_prompt_the_tokenizer_cannot_represent_is_a_400_naming_it(tmp_path) -> None:
    """The warm-started built-ins' tokenizer cannot spell "hello world": a completions prompt or a chat message of it
    is a 400 naming the field and the characters, and the engine is never called."""
    from sc_lightning.models.tiny_tokenizer import save_char_tokenizer
    from sc_lightning.testing.scripted_engine import ScriptedEngine
    from sc_lightning.tokenizer import load_tokenizer

    save_char_tokenizer(tmp_path)
    engine = ScriptedEngine()

    async def scenario() -> list[tuple[int, dict]]:
        tokenizer = load_tokenizer(str(tmp_path))
        endpoint = OpenAIEndpoint(engine, tokenizer, model_name="m", defaults=DEFAULTS, context_tokens=64)
        url = await endpoint.start()
        requests = [
            ("completions", {"prompt": "hello world"}),
            ("chat/completions", {"messages": [{"role": "user", "content": "hello world"}]}),
        ]
        answers = []
        try:
            async with aiohttp.ClientSession() as http:
                for route, body in requests:
                    async with http.post(f"{url}/{route}", json=body) as r:
                        answers.append((r.status, await r.json()))
        finally:
            await endpoint.stop()
        return answers

    (completion_status, completion), (chat_status, chat) = asyncio.run(scenario())
    lost = "cannot represent 'h', 'e', 'l', 'o', 'w', 'r', 'd' of 'hello world'"
    assert completion_status == chat_status == 400
    assert completion["error"]["message"].startswith("prompt: the tokenizer")
    assert lost in completion["error"]["message"]
    assert chat["error"]["message"].startswith("messages: the tokenizer")
    assert lost in chat["error"]["message"]
    assert engine.calls == 0
