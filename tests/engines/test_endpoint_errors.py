"""The endpoint's answers to client mistakes: a 400 (404 for a model) naming the field and the limit, never a 503.

Served over a real Megatron engine (32-token context), so a field that slipped past the checks would reach the
engine as it did before (a string seed: "manual_seed expected a long"). Also: random JSON values never get past the
parser unchecked, and a port already in use ends ``fit`` in one ``error:`` line (exit 2) before anything starts.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.rollout.multiturn.chat import CharChatTemplate
from sc_lightning.rollout.serving.listen import EndpointPortError, listen_on
from sc_lightning.rollout.serving.requests import BadRequest, parse_chat_request, parse_completion_request
from sc_lightning.rollout.serving.server import OpenAIEndpoint
from sc_lightning.rollout.serving.validation import MAX_SEED, completion_budget
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import SamplingParams

TOKENIZER = CharTokenizer()
DEFAULTS = SamplingParams(max_new_tokens=4, temperature=1.0)
CONTEXT = 32
PROMPT = {"prompt": "1+2="}
CHAT = {"messages": [{"role": "user", "content": "1+2"}]}


@pytest.fixture(scope="module")
def url(tiny_dirs: dict, model_parallel: None) -> Iterator[str]:
    """The endpoint over a real Megatron engine with a 32-token context, served from an event loop of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=120)

    async def make() -> tuple[MegatronEngine, OpenAIEndpoint]:
        engine = MegatronEngine.from_pretrained(str(tiny_dirs["a"]), max_seq_len=CONTEXT, stop_on_eos=False)
        endpoint = OpenAIEndpoint(engine, TOKENIZER, model_name="tiny-a", defaults=DEFAULTS, context_tokens=CONTEXT)
        return engine, endpoint

    engine, endpoint = run(make())
    try:
        yield run(endpoint.start())
    finally:
        run(endpoint.stop())
        run(engine.shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


def post(url: str, route: str, body: dict | str) -> tuple[int, dict]:
    """POST ``body`` (a dict as JSON, a string as is) to ``url``/``route``; the status and the JSON answer."""
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    request = urllib.request.Request(f"{url}/{route}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


CLIENT_MISTAKES = [  # route, body, status, param, what the message must say
    ("completions", {**PROMPT, "seed": "7"}, 400, "seed", "seed: give an integer >= 0 and <= 9223372036854775807"),
    ("completions", {**PROMPT, "seed": 1.5}, 400, "seed", "seed: give an integer"),
    ("completions", {**PROMPT, "seed": -1}, 400, "seed", "seed: give an integer >= 0"),
    ("completions", {**PROMPT, "max_tokens": -2}, 400, "max_tokens", "max_tokens: give an integer >= 1, got -2"),
    ("completions", {**PROMPT, "max_tokens": "8"}, 400, "max_tokens", "max_tokens: give an integer"),
    ("completions", {**PROMPT, "temperature": "hot"}, 400, "temperature", "give a finite number >= 0.0, got 'hot'"),
    ("completions", {**PROMPT, "temperature": -1}, 400, "temperature", "temperature: give a finite number >= 0.0"),
    ("completions", {**PROMPT, "temperature": 1e-30}, 400, "temperature", "give 0 (greedy) or a number >= 0.01"),
    ("completions", {**PROMPT, "top_p": 1.5}, 400, "top_p", "top_p: give a finite number > 0.0 and <= 1.0, got 1.5"),
    ("completions", {**PROMPT, "top_p": 0}, 400, "top_p", "top_p: give a finite number > 0.0"),
    ("completions", {**PROMPT, "top_k": 2.5}, 400, "top_k", "top_k: give an integer >= -1"),
    ("completions", '{"prompt": "1+2=", "temperature": NaN}', 400, "temperature", "give a finite number, got nan"),
    ("completions", '{"prompt": "1+2=", "top_p": Infinity}', 400, "top_p", "give a finite number, got inf"),
    ("completions", '{"prompt": "1+2=", "max_tokens": 1e999}', 400, "max_tokens", "give a finite number, got inf"),
    ("completions", {"prompt": [2] * 40}, 400, "prompt", "the prompt has 40 tokens, which leaves no room in the "),
    ("completions", {"prompt": [2] * 20, "max_tokens": 20}, 400, "max_tokens", "20 tokens + max_tokens 20 = 40"),
    ("completions", {"prompt": [2, 4, 99]}, 400, "prompt", "prompt[2]: token id 99 is outside the vocabulary of 18"),
    ("completions", {"prompt": [2, -1]}, 400, "prompt", "prompt[1]: token id -1 is outside the vocabulary"),
    ("completions", {"prompt": ["1+2=", "3+4="]}, 400, "prompt", "a batch of 2 prompts is not served"),
    ("completions", {**PROMPT, "model": "gpt-4"}, 404, "model", "'gpt-4' is not served here; this endpoint serves"),
    ("completions", {**PROMPT, "stream": True}, 400, "stream", "stream: streaming is not served"),
    ("completions", {**PROMPT, "stop": ["\n"]}, 400, "stop", "stop: stop sequences are not served"),
    ("completions", {**PROMPT, "n": 2}, 400, "n", "n: only 1 completion per request is served"),
    ("completions", {**PROMPT, "logprobs": 5}, 400, "logprobs", "top alternatives are not served"),
    ("completions", {**PROMPT, "echo": True}, 400, "echo", "the prompt is not echoed"),
    ("completions", '{"prompt": ', 400, None, "the body is not valid JSON"),
    ("chat/completions", {**CHAT, "seed": 2.0}, 400, "seed", "seed: give an integer"),
    ("chat/completions", '{"messages": [{"role": "user", "content": "1"}], "top_p": NaN}', 400, "top_p", "finite"),
    ("chat/completions", {**CHAT, "model": "other"}, 404, "model", "'other' is not served here"),
    ("chat/completions", {**CHAT, "stream": True}, 400, "stream", "stream: streaming is not served"),
    ("chat/completions", {**CHAT, "max_completion_tokens": 40}, 400, "max_completion_tokens", "5 tokens + max_com"),
    ("chat/completions", {**CHAT, "logprobs": 3}, 400, "logprobs", "logprobs: give true or false"),
    ("chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs", "top alternatives are not served"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 12}]}]},
        400,
        "messages[0].content",
        "messages[0].content: give a string or a list of text parts",
    ),
]


@pytest.mark.parametrize(("route", "body", "status", "param", "message"), CLIENT_MISTAKES)
def test_a_client_mistake_is_a_400_naming_the_field_and_the_limit(
    url: str, route: str, body: dict | str, status: int, param: str | None, message: str
) -> None:
    answer_status, answer = post(url, route, body)
    assert answer_status == status, answer
    error = answer["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert message in error["message"], error["message"]
    assert error["code"] == ("model_not_found" if status == 404 else None)


def test_requests_within_the_limits_are_served_and_an_omitted_max_tokens_fits_the_context(url: str) -> None:
    """The named model, null fields, an off top_k, the largest seed; a 30-token prompt without max_tokens gets the
    2 tokens the context leaves (not the default 4), one with max_tokens 2 is served exactly."""
    body = {**PROMPT, "model": "tiny-a", "seed": MAX_SEED, "top_k": -1, "temperature": None, "stream": False, "n": 1}
    status, answer = post(url, "completions", body)
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == DEFAULTS.max_new_tokens
    status, answer = post(url, "completions", {"prompt": [2] * 30})
    assert (status, answer["usage"]["completion_tokens"]) == (200, 2), answer
    status, answer = post(url, "chat/completions", {**CHAT, "max_tokens": 2, "logprobs": True, "user": "agent-7"})
    assert (status, answer["usage"]["completion_tokens"]) == (200, 2), answer


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=6,
)
FIELDS = ("prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n", "stream")


@given(st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES))
def test_random_field_values_are_refused_or_give_settings_the_engine_accepts(body: dict) -> None:
    """Whatever JSON values the fields hold: a BadRequest, or a prompt and settings the engine takes as they are."""
    try:
        parsed = parse_completion_request({**PROMPT, **body}, TOKENIZER, DEFAULTS)
        budget = completion_budget(len(parsed.prompt_ids), None, parsed.sampling.max_new_tokens, CONTEXT, "prompt")
    except BadRequest:
        return
    sampling = parsed.sampling
    assert parsed.prompt_ids and all(type(t) is int and 0 <= t < TOKENIZER.vocab_size for t in parsed.prompt_ids)
    assert type(sampling.max_new_tokens) is int and 1 <= budget <= sampling.max_new_tokens
    assert type(sampling.temperature) is float and (sampling.temperature == 0 or sampling.temperature >= 0.01)
    assert type(sampling.top_p) is float and 0 < sampling.top_p <= 1
    assert sampling.top_k is None or (type(sampling.top_k) is int and sampling.top_k >= 1)
    assert sampling.seed is None or (type(sampling.seed) is int and 0 <= sampling.seed <= MAX_SEED)


@given(st.dictionaries(st.sampled_from(("temperature", "top_p", "seed", "max_tokens")), JSON_VALUES))
def test_random_chat_sampling_values_are_refused_or_accepted_whole(fields: dict) -> None:
    try:
        parsed = parse_chat_request({**CHAT, **fields}, CharChatTemplate(TOKENIZER), DEFAULTS)
    except BadRequest:
        return
    assert type(parsed.sampling.temperature) is float and type(parsed.sampling.max_new_tokens) is int


class HungEngine:
    """FAKE engine whose generation never answers (a wedged engine), for the endpoint's own deadline."""

    name = "hung"

    async def generate(self, prompt_token_ids: tuple[int, ...], sampling: SamplingParams) -> None:
        await asyncio.Event().wait()


def test_a_call_of_no_rollout_that_the_engine_never_answers_is_a_504_at_the_generation_deadline() -> None:
    """A plain completion is bounded by async_rl.rollout_failure.generation_timeout_s (a rollout's calls are bounded
    by its rollout_timeout_s): past it the client gets a 504 naming the engine and the knob, not a hung request."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    endpoint = OpenAIEndpoint(
        HungEngine(), TOKENIZER, model_name="m", defaults=DEFAULTS, context_tokens=CONTEXT, generation_timeout_s=0.5
    )
    try:
        url = asyncio.run_coroutine_threadsafe(endpoint.start(), loop).result(timeout=60)
        status, answer = post(url, "completions", PROMPT)
    finally:
        asyncio.run_coroutine_threadsafe(endpoint.stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
    assert status == 504
    assert answer["error"]["message"] == (
        "engine 'hung' did not answer within async_rl.rollout_failure.generation_timeout_s=0.5"
    )


def test_a_port_in_use_is_an_error_naming_the_knob_and_the_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(EndpointPortError) as caught:
            listen_on("127.0.0.1", port, "policy.generation.mcore_generation_config.")
        endpoint = OpenAIEndpoint(object(), TOKENIZER, model_name="m", defaults=DEFAULTS, context_tokens=8, port=port)
        with pytest.raises(EndpointPortError, match=f"http_port: port {port} on 127.0.0.1 is already in use"):
            asyncio.run(endpoint.start())
    assert str(caught.value) == (
        f"policy.generation.mcore_generation_config.http_port: port {port} on 127.0.0.1 is already in use by "
        "another process; give another port, or 0 for a free one"
    )
    with pytest.raises(EndpointPortError, match=r"prefix.http_host: '192.0.2.1' is not an address of this machine"):
        listen_on("192.0.2.1", 0, "prefix.")  # TEST-NET-1: never a local address


@pytest.mark.slow
def test_fit_with_its_endpoint_port_in_use_ends_in_one_error_line_before_anything_starts(tmp_path: Path) -> None:
    """Exit 2, one ``error:`` line naming the knob and the port, no traceback, no banner (nothing started)."""
    from tests.helpers.cli import error_lines, run
    from tests.helpers.configs import TINY

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run(
            "fit",
            "--config",
            TINY,
            "--config",
            "configs/colocated.yaml",
            "--data_plane.backend=memory",
            "--policy.generation.mcore_generation_config.expose_http_server=true",
            f"--policy.generation.mcore_generation_config.http_port={port}",
            f"--trainer.default_root_dir={tmp_path}",
        )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert error_lines(result.stderr) == [
        f"error: policy.generation.mcore_generation_config.http_port: port {port} on 127.0.0.1 is already in use by "
        "another process; give another port, or 0 for a free one"
    ]
    assert "sc_lightning grpo:" not in result.stderr  # the banner: the engine and controller never started
