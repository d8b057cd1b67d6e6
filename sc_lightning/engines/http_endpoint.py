"""An OpenAI-compatible completions endpoint on loopback over any generation engine, for external rollout agents.

``POST /v1/completions`` takes ``prompt`` (text, or a list of token ids), ``max_tokens``, ``temperature``,
``top_p``, ``top_k``, ``seed`` and ``stop_token_ids``; each choice reports the generated ``text``, ``token_ids``,
the prompt's ``prompt_token_ids``, ``logprobs`` (``tokens`` and ``token_logprobs``, the engine's convention) and
``finish_reason``. Every response carries ``weight_version`` (the version that admitted the request) and
``weight_version_end`` (the engine's version when it finished), so an agent can tell which policy answered, and
``token_versions`` (the version that sampled each completion token: two values when a refit landed mid-request).
``GET /v1/models`` lists the one served model. Bad requests get a 400 with an OpenAI-style error body; an engine
failure a 503 naming the engine.

The endpoint runs on the event loop that owns the engine (the controller's): :meth:`start` and :meth:`stop` are
coroutines to be run there. It binds 127.0.0.1 only.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from sc_lightning.engines.base import EngineError, GenerationEngine
from sc_lightning.tokenizer import Tokenizer, prompt_token_ids
from sc_lightning.types import SamplingParams


class BadRequest(ValueError):
    """A completions request the endpoint cannot serve; the message says which field and why."""


def parse_request(body: Any, tokenizer: Tokenizer, defaults: SamplingParams) -> tuple[tuple[int, ...], SamplingParams]:
    """The prompt's token ids and the sampling parameters of a ``/v1/completions`` JSON body."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = prompt_token_ids(tokenizer, prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = tuple(prompt)
    else:
        raise BadRequest("prompt: give a string or a non-empty list of token ids")
    if body.get("n", 1) != 1:
        raise BadRequest("n: only 1 completion per request is served (send several requests)")
    try:
        sampling = SamplingParams(
            max_new_tokens=int(body.get("max_tokens", defaults.max_new_tokens)),
            temperature=float(body.get("temperature", defaults.temperature)),
            top_p=float(body.get("top_p", defaults.top_p)),
            top_k=body.get("top_k", defaults.top_k),
            seed=body.get("seed"),
        )
    except (TypeError, ValueError) as err:
        raise BadRequest(f"sampling fields: {err}") from None
    if sampling.max_new_tokens < 1:
        raise BadRequest("max_tokens: must be >= 1")
    return ids, sampling


class CompletionsEndpoint:
    """Serves ``engine`` over HTTP on 127.0.0.1 (``port`` 0 picks a free one)."""

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Tokenizer,
        *,
        model_name: str,
        defaults: SamplingParams,
        port: int = 0,
    ) -> None:
        self.engine, self.tokenizer, self.model_name, self.defaults = engine, tokenizer, model_name, defaults
        self.port = port
        self._runner: Any = None
        self._ids = itertools.count()

    async def start(self) -> str:
        """Start serving; returns the base URL (``http://127.0.0.1:<port>/v1``)."""
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{self.port}/v1"

    async def stop(self) -> None:
        """Stop serving (requests in flight are cancelled); idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def _completions(self, request: Any) -> Any:
        from aiohttp import web

        try:
            prompt, sampling = parse_request(await request.json(), self.tokenizer, self.defaults)
        except (BadRequest, ValueError) as err:
            return web.json_response({"error": {"message": str(err), "type": "invalid_request_error"}}, status=400)
        try:
            generation = await self.engine.generate(prompt, sampling)
        except EngineError as err:
            return web.json_response({"error": {"message": str(err), "type": "engine_error"}}, status=503)
        tokens = [self.tokenizer.decode((t,)) for t in generation.token_ids]
        choice = {
            "index": 0,
            "text": self.tokenizer.decode(generation.token_ids),
            "token_ids": list(generation.token_ids),
            "prompt_token_ids": list(prompt),
            "logprobs": {"tokens": tokens, "token_logprobs": list(generation.logprobs)},
            "finish_reason": generation.finish_reason,
        }
        return web.json_response(
            {
                "id": f"cmpl-{next(self._ids)}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(generation.token_ids),
                    "total_tokens": len(prompt) + len(generation.token_ids),
                },
                "weight_version": generation.weight_version,
                "weight_version_end": self.engine.weight_version,
                "token_versions": list(generation.token_versions),
            }
        )
