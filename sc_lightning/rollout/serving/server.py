"""An OpenAI-compatible endpoint on loopback over any generation engine, for external rollout agents.

Routes (the request bodies are parsed in :mod:`~sc_lightning.rollout.serving.requests`):

- ``POST /v1/completions``: ``prompt`` (text, or a list of token ids), ``max_tokens``, ``temperature``, ``top_p``,
  ``top_k``, ``seed``; each choice reports the generated ``text``, ``token_ids``, the prompt's
  ``prompt_token_ids``, ``logprobs`` (``tokens`` and ``token_logprobs``, the engine's convention) and
  ``finish_reason``.
- ``POST /v1/chat/completions``: ``messages`` rendered with the tokenizer's chat template (generation prompt
  added; :func:`~sc_lightning.rollout.multiturn.chat.chat_template_for`); the choice is ``message`` (role
  ``assistant``, ``content``) and ``finish_reason``, with the same ``token_ids`` / ``prompt_token_ids`` /
  ``logprobs`` extras.
- ``GET /v1/models`` lists the one served model.

Every model response carries ``usage``, ``weight_version`` (the version that admitted the request),
``weight_version_end`` (the engine's version when it finished) and ``token_versions`` (the version that sampled each
completion token: two values when a refit landed mid-request). With external rollouts on (``rollouts`` given), a
model request may carry ``rollout_id`` (OpenAI clients: ``extra_body``) to be attributed to that rollout, and the
agent routes ``GET /v1/rollouts/next`` and ``POST /v1/rollouts/{rollout_id}/reward`` are served
(:mod:`sc_lightning.rollout.external`). Errors are OpenAI-style bodies: 400 naming the bad field, 404 / 409 naming the
rollout id, 503 naming the engine. Every field is checked before the engine sees the request
(:mod:`~sc_lightning.rollout.serving.validation`): a client's mistake — a wrong type, a value out of range or not
finite, a prompt that does not fit the ``context_tokens`` with its ``max_tokens``, a token id outside the tokenizer's
vocabulary, a field the endpoint does not serve (``stream``, ``stop``, ``n`` > 1 …) — is a 400 naming the field
(``param``) and the limit, an unknown ``model`` a 404; only an engine failure is a 503.

**Access.** With an API key every route needs ``Authorization: Bearer <key>`` (compared in constant time); without
it a request is a 401 that never reaches a handler. A body over :data:`MAX_BODY_BYTES` is a 413 naming the limit. A
reward is accepted once, only for a rollout the endpoint handed out and only while its group waits for it
(:mod:`sc_lightning.rollout.external`: 404 / 409 otherwise).

The endpoint runs on the event loop that owns the engine (the controller's): :meth:`start` and :meth:`stop` are
coroutines to be run there. It listens on ``host`` (127.0.0.1 by default), on a socket given to it (bound before the
run starts: :func:`~sc_lightning.rollout.serving.listen.listen_on`) or bound at :meth:`start`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import itertools
import socket
import time
from typing import Any

from sc_lightning.engines.base import EngineError, GenerationEngine
from sc_lightning.rollout.chat_continuation import ChatTurn, continuation_ids
from sc_lightning.rollout.external import ExternalRollout, ExternalRollouts, RolloutStateError
from sc_lightning.rollout.multiturn.chat import ChatTemplate, ChatTemplateError, chat_template_for
from sc_lightning.rollout.serving.listen import LOOPBACK, listen_on
from sc_lightning.rollout.serving.requests import (
    BadRequest,
    ModelRequest,
    parse_chat_request,
    parse_completion_request,
    parse_reward,
)
from sc_lightning.rollout.serving.validation import check_model, completion_budget, load_body, wait_seconds
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import Generation, SamplingParams

MAX_BODY_BYTES = 8 * 2**20
"""The largest request body the endpoint reads (a prompt of about a million token ids): larger ones are a 413."""
STOP_GRACE_S = 1.0
"""Seconds :meth:`OpenAIEndpoint.stop` lets calls in flight finish; it then cancels those still waiting (on an engine
that stood down for a training step, say) and closes their connections, giving them as long again to end (aiohttp's
shutdown timeout, a minute by default)."""


class OpenAIEndpoint:
    """Serves ``engine`` over HTTP on ``host``; ``rollouts`` adds the agent routes; ``api_key`` guards every route.

    ``context_tokens``: the engine's longest sequence (prompt + completion). ``sock``: a socket already listening
    (see :func:`~sc_lightning.rollout.serving.listen.listen_on`), else :meth:`start` binds ``host``:``port`` (0 picks
    a free one).
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Tokenizer,
        *,
        model_name: str,
        defaults: SamplingParams,
        context_tokens: int,
        host: str = LOOPBACK,
        port: int = 0,
        sock: socket.socket | None = None,
        rollouts: ExternalRollouts | None = None,
        api_key: str | None = None,
        generation_timeout_s: float | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.model_name, self.defaults = engine, tokenizer, model_name, defaults
        self.generation_timeout_s = generation_timeout_s  # a call of no rollout (whose deadline bounds the others)
        self.context_tokens, self.host, self.port, self.rollouts = context_tokens, host, port, rollouts
        self._bearer = None if api_key is None else f"Bearer {api_key}".encode()
        self._sock = sock
        self._runner: Any = None
        self._ids = itertools.count()
        self._template: ChatTemplate | None = None

    async def start(self) -> str:
        """Start serving; returns the base URL (``http://<host>:<port>/v1``)."""
        from aiohttp import web

        @web.middleware
        async def guard(request: Any, handler: Any) -> Any:
            return await self._guard(request, handler)

        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[guard])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models)
        if self.rollouts is not None:
            app.router.add_get("/v1/rollouts/next", self._next_rollout)
            app.router.add_post("/v1/rollouts/{rollout_id}/reward", self._reward)
        sock = self._sock if self._sock is not None else listen_on(self.host, self.port)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=STOP_GRACE_S)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.port = sock.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    async def _guard(self, request: Any, handler: Any) -> Any:
        """Every route: a 401 without the API key (when there is one), a 413 for a body over the limit."""
        from aiohttp import web

        given = request.headers.get("Authorization", "").encode()
        if self._bearer is not None and not hmac.compare_digest(given, self._bearer):
            return _error(401, "a valid API key is needed: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the request body is over the endpoint's limit of {MAX_BODY_BYTES} bytes")

    async def stop(self) -> None:
        """Stop serving: calls in flight get :data:`STOP_GRACE_S` to finish, then are cancelled (their connections
        closed); idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _models(self, request: Any) -> Any:
        return _json({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def _completions(self, request: Any) -> Any:
        try:
            body = await self._model_body(request)
            parsed = self._fit(parse_completion_request(body, self.tokenizer, self.defaults), "prompt")
        except BadRequest as err:
            return _bad_request(err)
        return await self._serve(parsed, chat=False)

    async def _chat_completions(self, request: Any) -> Any:
        try:
            body = await self._model_body(request)
            parsed = self._fit(parse_chat_request(body, self._chat_template(), self.defaults), "messages")
        except BadRequest as err:
            return _bad_request(err)
        return await self._serve(parsed, chat=True)

    async def _model_body(self, request: Any) -> Any:
        """The JSON body of a model request, whose ``model`` (if any) must be the served one; BadRequest if not."""
        body = load_body(await request.read())
        if isinstance(body, dict):
            check_model(body, self.model_name)
        return body

    def _fit(self, parsed: ModelRequest, field: str) -> ModelRequest:
        """``parsed`` with its completion budget within the context (a rollout's call is held to its rollout's
        room instead: :meth:`_attribute`); BadRequest naming ``field`` or the max_tokens field when it cannot fit."""
        if parsed.rollout_id is not None:
            return parsed
        sampling, limit = parsed.sampling, parsed.max_tokens_field
        given = None if limit is None else sampling.max_new_tokens
        budget = completion_budget(
            len(parsed.prompt_ids), given, sampling.max_new_tokens, self.context_tokens, field, limit or "max_tokens"
        )
        return dataclasses.replace(parsed, sampling=dataclasses.replace(sampling, max_new_tokens=budget))

    def _chat_template(self) -> ChatTemplate:
        if self._template is None:
            try:
                self._template = chat_template_for(self.tokenizer)
            except ChatTemplateError as err:
                raise BadRequest(f"messages: {err}") from None
        return self._template

    async def _serve(self, parsed: ModelRequest, *, chat: bool) -> Any:
        """Generate for ``parsed`` (attributed to its rollout, if any) and answer in the completions or chat shape."""
        if parsed.rollout_id is None:
            wait_for = getattr(self.engine, "active_wait_for", asyncio.wait_for)  # stood-down time does not count
            try:
                generation = await wait_for(
                    self.engine.generate(parsed.prompt_ids, parsed.sampling), self.generation_timeout_s
                )
            except EngineError as err:
                return _error(503, str(err), "engine_error")
            except TimeoutError:
                return _error(504, self._late(), "engine_error")
            return _json(self._response(parsed, generation, chat=chat))
        if self.rollouts is None:
            return _error(
                400, "rollout_id: this run serves no external rollouts (env.name: external)", param="rollout_id"
            )
        try:
            rollout, parsed = self._attribute(parsed, self.rollouts)
        except RolloutStateError as err:
            return _error(err.status, str(err), "rollout_error")
        try:
            generation = await self.engine.generate(parsed.prompt_ids, parsed.sampling)
        except BaseException as exc:
            self.rollouts.end_call(rollout, parsed.prompt_ids, None)  # the rollout may take another call
            if isinstance(exc, EngineError):
                return _error(503, str(exc), "engine_error")
            raise
        turn = None
        if parsed.messages is not None:
            turn = ChatTurn(parsed.messages, generation.token_ids, self.tokenizer.decode(generation.token_ids))
        try:
            self.rollouts.end_call(rollout, parsed.prompt_ids, generation, turn)
        except RolloutStateError as err:
            return _error(err.status, str(err), "rollout_error")
        return _json(self._response(parsed, generation, chat=chat))

    def _late(self) -> str:
        """Why a call of no rollout went unanswered: the engine passed the generation deadline."""
        return (
            f"engine {self.engine.name!r} did not answer within async_rl.rollout_failure.generation_timeout_s="
            f"{self.generation_timeout_s}"
        )

    def _attribute(self, parsed: ModelRequest, rollouts: ExternalRollouts) -> tuple[ExternalRollout, ModelRequest]:
        """Begin ``parsed``'s call of its rollout: its prompt (a chat call after a chat turn continues that turn's
        exact tokens: :mod:`~sc_lightning.rollout.chat_continuation`), budget and seed; RolloutStateError if refused."""
        rollout_id = str(parsed.rollout_id)
        rollout = rollouts.claimed(rollout_id)
        prompt_ids = parsed.prompt_ids
        if parsed.messages is not None and rollout.chat is not None:
            try:
                tail = continuation_ids(self._chat_template(), rollout.chat, parsed.messages)
            except ValueError as err:
                raise RolloutStateError(409, f"rollout {rollout_id}: {err}") from None
            prompt_ids = rollout.transcript.context + tuple(tail)
        rollouts.begin_call(rollout_id, prompt_ids)
        seed = parsed.sampling.seed if parsed.seeded else rollout.call_seed()
        budget = min(parsed.sampling.max_new_tokens, rollouts.room(prompt_ids))
        sampling = dataclasses.replace(parsed.sampling, max_new_tokens=budget, seed=seed)
        return rollout, dataclasses.replace(parsed, prompt_ids=prompt_ids, sampling=sampling)

    def _response(self, parsed: ModelRequest, generation: Generation, *, chat: bool) -> dict[str, Any]:
        text = self.tokenizer.decode(generation.token_ids)
        choice: dict[str, Any] = {"index": 0}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        choice.update(
            token_ids=list(generation.token_ids),
            prompt_token_ids=list(parsed.prompt_ids),
            logprobs={
                "tokens": [self.tokenizer.decode((t,)) for t in generation.token_ids],
                "token_logprobs": list(generation.logprobs),
            },
            finish_reason=generation.finish_reason,
        )
        prompt, completion = len(parsed.prompt_ids), len(generation.token_ids)
        body: dict[str, Any] = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            "weight_version": generation.weight_version,
            "weight_version_end": self.engine.weight_version,
            "token_versions": list(generation.token_versions),
        }
        if parsed.rollout_id is not None:
            body["rollout_id"] = parsed.rollout_id
        return body

    async def _next_rollout(self, request: Any) -> Any:
        """Long-poll for an unclaimed rollout: 200 with it, or 204 when none came within ``wait_s``."""
        from aiohttp import web

        assert self.rollouts is not None
        try:
            wait_s = wait_seconds(request.query, 10.0)
        except BadRequest as err:
            return _bad_request(err)
        rollout = await self.rollouts.claim(wait_s)
        if rollout is None:
            return web.Response(status=204)
        prompt = rollout.prompt
        return _json(
            {
                "rollout_id": rollout.rollout_id,
                "prompt_id": prompt.prompt_id,
                "group_id": rollout.group_id,
                "messages": [{"role": "user", "content": prompt.text}],
                "text": prompt.text,
                "prompt_token_ids": list(prompt.token_ids),
                "answer": prompt.answer,
                "extra": dict(prompt.extra),
            }
        )

    async def _reward(self, request: Any) -> Any:
        assert self.rollouts is not None
        rollout_id = request.match_info["rollout_id"]
        try:
            score = parse_reward(load_body(await request.read()))
        except BadRequest as err:
            return _bad_request(err)
        try:
            rollout = self.rollouts.finish(rollout_id, score)
        except RolloutStateError as err:
            return _error(err.status, str(err), "rollout_error")
        transcript = rollout.transcript
        return _json(
            {
                "rollout_id": rollout_id,
                "reward": score.reward,
                "model_calls": transcript.model_calls,
                "completion_tokens": len(transcript.token_ids),
                "trained_tokens": sum(transcript.trainable),
            }
        )


def _json(body: dict[str, Any], status: int = 200) -> Any:
    from aiohttp import web

    return web.json_response(body, status=status)


def _error(
    status: int, message: str, kind: str = "invalid_request_error", *, param: str | None = None, code: str | None = None
) -> Any:
    """An OpenAI-shaped error body: ``message``, ``type``, ``param`` (the field at fault) and ``code``."""
    return _json({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def _bad_request(err: BadRequest) -> Any:
    """The client's mistake ``err`` as its status (400, or 404 for an unknown model) naming the field."""
    return _error(err.status, str(err), "invalid_request_error", param=err.param, code=err.code)
