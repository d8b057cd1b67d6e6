"""Who may use the endpoint: with an API key every route needs it (a 401 without, over real HTTP), bodies are
bounded (413), and an endpoint served beyond this machine refuses to start without a key, which is never printed.

The reward routes accept a reward once, only for a rollout the endpoint handed out and only while its group waits
(404 / 409 otherwise): tests/rollout/test_external.py."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from sc_lightning.cli.main import main
from sc_lightning.rollout.serving.listen import is_loopback
from sc_lightning.rollout.serving.server import MAX_BODY_BYTES, OpenAIEndpoint
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import SamplingParams
from tests.helpers.configs import REPO, TINY

KEY = "s3cret-key-for-the-test"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """The endpoint, guarded by KEY, on 127.0.0.1 and an event loop of its own (no engine: these requests never
    reach one)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    endpoint = OpenAIEndpoint(
        object(),
        CharTokenizer(),
        model_name="m",
        defaults=SamplingParams(max_new_tokens=4),
        context_tokens=8,
        api_key=KEY,
    )
    try:
        yield asyncio.run_coroutine_threadsafe(endpoint.start(), loop).result(timeout=60)
    finally:
        asyncio.run_coroutine_threadsafe(endpoint.stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


def call(url: str, route: str, *, key: str | None, body: bytes | None = None) -> tuple[int, dict]:
    """GET (or POST ``body``) ``route`` with ``key`` as a Bearer token (None: no header); the status and the JSON."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key is not None else {})
    request = urllib.request.Request(f"{url}/{route}", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("key", [None, "wrong", KEY + "x", ""])
@pytest.mark.parametrize("route", ["models", "completions", "chat/completions"])
def test_every_route_needs_the_api_key(url: str, route: str, key: str | None) -> None:
    body = None if route == "models" else b'{"prompt": "1+2="}'
    status, answer = call(url, route, key=key, body=body)
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    assert KEY not in json.dumps(answer)


def test_the_right_key_is_let_through_and_bodies_are_bounded(url: str) -> None:
    assert call(url, "models", key=KEY) == (200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
    status, answer = call(url, "completions", key=KEY, body=b" " * (MAX_BODY_BYTES + 1))
    assert status == 413 and f"limit of {MAX_BODY_BYTES} bytes" in answer["error"]["message"]


def test_loopback_is_told_apart_from_other_addresses() -> None:
    assert all(is_loopback(host) for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "10.1.2.3", "::", "example.org"))


ENDPOINT = "policy.generation.mcore_generation_config"
SERVE_EVERYWHERE = (f"--{ENDPOINT}.expose_http_server", "true", f"--{ENDPOINT}.http_host", "0.0.0.0")


def test_serving_beyond_this_machine_without_a_key_is_refused_at_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("SC_LIGHTNING_API_KEY", raising=False)
    assert main(["fit", "--config", TINY, *SERVE_EVERYWHERE, "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert f"{ENDPOINT}.http_host: is '0.0.0.0', serving the endpoint beyond this machine" in err
    assert f"SC_LIGHTNING_API_KEY ({ENDPOINT}.http_api_key_env) holds no API key" in err
    monkeypatch.setenv("MY_KEY", KEY)
    args = ["fit", "--config", TINY, *SERVE_EVERYWHERE, f"--{ENDPOINT}.http_api_key_env", "MY_KEY", "--dry_run"]
    assert main(args) == 0
    assert KEY not in "".join(capsys.readouterr())  # the key itself is never printed
