"""Checks of the endpoint's request fields: the JSON itself, each field's type and range, and what is not served.

Every check raises :class:`BadRequest` (or :class:`UnknownModel`) naming the field — its ``param`` in the OpenAI
error body — and the limit; nothing a client sends reaches the engine unchecked, so an engine failure (a 503) is
never the client's mistake. ``null`` means "left out" for every optional field, as in OpenAI's API.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIN_TEMPERATURE = 0.01  # a smaller positive temperature overflows the scaled logits (vLLM clamps to it)
MAX_TOP_K = 2**31 - 1
MAX_SEED = 2**63 - 1
MAX_CLAIM_WAIT_S = 60.0  # the longest long-poll of GET /v1/rollouts/next (?wait_s=, default 10)


class BadRequest(ValueError):
    """A request the endpoint cannot serve (HTTP ``status``); the message says which field (``param``) and why."""

    status = 400

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


class UnknownModel(BadRequest):
    """A request for a model this endpoint does not serve (404, OpenAI's ``model_not_found``)."""

    status = 404


@dataclass(frozen=True)
class Unserved:
    """An OpenAI field the endpoint does not serve: refused unless its value is one of ``neutral`` (type and value)."""

    field: str
    neutral: tuple[Any, ...]
    why: str


UNSERVED_COMMON = (
    Unserved("stream", (False,), "streaming is not served; leave it out or false"),
    Unserved("stream_options", (), "streaming is not served; leave it out"),
    Unserved("n", (1,), "only 1 completion per request is served (send several requests)"),
    Unserved("stop", ("", []), "stop sequences are not served (a completion ends at the eos token or max_tokens)"),
    Unserved("logit_bias", ({},), "logit biases are not served (the loss needs the model's own distribution)"),
    Unserved("presence_penalty", (0, 0.0), "penalties are not served (the loss needs the model's own distribution)"),
    Unserved("frequency_penalty", (0, 0.0), "penalties are not served (the loss needs the model's own distribution)"),
    Unserved("repetition_penalty", (1, 1.0), "penalties are not served (the loss needs the model's own distribution)"),
    Unserved("min_tokens", (0,), "min_tokens is not served"),
    Unserved("ignore_eos", (False,), "ignore_eos is not served"),
    Unserved("response_format", ({"type": "text"},), "only text responses are served"),
)
"""Refused on both routes unless neutral; any other field OpenAI defines (``user``, ``metadata``, ``tools`` …) is
ignored, as vLLM's server does."""
UNSERVED_COMPLETIONS = (
    *UNSERVED_COMMON,
    Unserved("best_of", (1,), "only 1 completion per request is served"),
    Unserved("echo", (False,), "the prompt is not echoed (each choice has its prompt_token_ids)"),
    Unserved("suffix", ("",), "suffixes are not served"),
    Unserved(
        "logprobs",
        (0,),
        "top alternatives are not served; every choice has its sampled tokens' logprobs.token_logprobs, "
        "leave it out or 0",
    ),
)
UNSERVED_CHAT = (
    *UNSERVED_COMMON,
    Unserved(
        "top_logprobs",
        (0,),
        "top alternatives are not served; every choice has its sampled tokens' logprobs.token_logprobs, "
        "leave it out or 0",
    ),
)


def load_body(raw: bytes) -> Any:
    """The JSON of a request body; BadRequest when it is not JSON or holds a number that is not finite (``NaN``,
    ``Infinity``, ``1e999``), naming where."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError; nesting past the stack
        raise BadRequest(f"the body is not valid JSON: {err}") from None
    found = _non_finite(body)
    if found is not None:
        path, value = found
        raise BadRequest(f"{path}: give a finite number, got {value} (JSON has no NaN or Infinity)", param=path)
    return body


def _non_finite(body: Any) -> tuple[str, float] | None:
    """The path and value of the first float in ``body`` that is not finite, or None."""
    stack: list[tuple[str, Any]] = [("body", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path.removeprefix("body."), value
        if isinstance(value, dict):
            stack.extend((f"{path}.{key}", item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return None


def json_object(body: Any) -> dict[str, Any]:
    """``body`` when it is a JSON object; BadRequest otherwise."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def check_model(body: dict[str, Any], served: str) -> None:
    """``model``, when given, must name the served model: UnknownModel (404) otherwise."""
    model = body.get("model")
    if model is None or model == served:
        return
    if not isinstance(model, str):
        raise BadRequest(f"model: give the served model's name {served!r} (GET /v1/models), got {model!r}", "model")
    raise UnknownModel(
        f"model: {model!r} is not served here; this endpoint serves {served!r} (GET /v1/models)",
        "model",
        "model_not_found",
    )


def refuse_unserved(body: dict[str, Any], unserved: Sequence[Unserved]) -> None:
    """BadRequest naming the first field of ``unserved`` that ``body`` gives a value other than null or neutral."""
    for rule in unserved:
        value = body.get(rule.field)
        if value is not None and not any(type(value) is type(n) and value == n for n in rule.neutral):
            raise BadRequest(f"{rule.field}: {rule.why}; got {value!r}", rule.field)


def integer(body: dict[str, Any], field: str, minimum: int, maximum: int | None = None) -> int | None:
    """``body[field]``, an integer in ``[minimum, maximum]``, or None when left out; BadRequest naming the range."""
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not _within(value, minimum, maximum):
        raise BadRequest(f"{field}: give an integer{_bounds(minimum, maximum)}, got {value!r}", field)
    return value


def number(
    body: dict[str, Any], field: str, minimum: float = -math.inf, maximum: float | None = None, *, above: bool = False
) -> float | None:
    """``body[field]``, a finite number of at least ``minimum`` (``above``: more than it) and at most ``maximum``, or
    None when left out; BadRequest naming the range."""
    value = body.get(field)
    if value is None:
        return None
    wanted = f"{field}: give a finite number{_bounds(minimum, maximum, above=above)}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(wanted, field)
    try:
        result = float(value)
    except OverflowError:  # an integer too large for a float
        raise BadRequest(wanted, field) from None
    if not _within(result, minimum, maximum) or (above and result == minimum):
        raise BadRequest(wanted, field)
    return result


def boolean(body: dict[str, Any], field: str) -> bool | None:
    """``body[field]``, true or false, or None when left out; BadRequest otherwise."""
    value = body.get(field)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"{field}: give true or false, got {value!r}", field)
    return value


def max_tokens(body: dict[str, Any]) -> int | None:
    """``max_tokens`` or ``max_completion_tokens`` (the chat API's newer name; both given must agree): an integer
    >= 1, or None when left out."""
    given = {integer(body, field, 1) for field in ("max_tokens", "max_completion_tokens")} - {None}
    if len(given) > 1:
        raise BadRequest(
            f"max_completion_tokens: {body['max_completion_tokens']!r} differs from max_tokens {body['max_tokens']!r}; "
            "give one of them",
            "max_completion_tokens",
        )
    return given.pop() if given else None


def temperature(body: dict[str, Any]) -> float | None:
    """``temperature``: 0 (greedy) or at least MIN_TEMPERATURE, or None when left out."""
    value = number(body, "temperature", 0.0)
    if value is not None and 0 < value < MIN_TEMPERATURE:
        raise BadRequest(
            f"temperature: give 0 (greedy) or a number >= {MIN_TEMPERATURE} (a smaller one overflows the scaled "
            f"logits), got {body['temperature']!r}",
            "temperature",
        )
    return value


def top_k(body: dict[str, Any]) -> int | None:
    """``top_k``: an integer >= 1, or None when left out or off (-1 or 0, vLLM's conventions)."""
    value = integer(body, "top_k", -1, MAX_TOP_K)
    return value if value is not None and value > 0 else None


def token_ids(ids: Sequence[Any], field: str, vocab_size: int) -> tuple[int, ...]:
    """``ids``, a non-empty list of token ids of the vocabulary ``range(vocab_size)``; BadRequest naming the first
    that is not."""
    if not ids:
        raise BadRequest(f"{field}: give a non-empty list of token ids", field)
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int):
            raise BadRequest(f"{field}[{i}]: a token id is an integer, got {token!r}", field)
        if not 0 <= token < vocab_size:
            raise BadRequest(
                f"{field}[{i}]: token id {token} is outside the vocabulary of {vocab_size} ids (0..{vocab_size - 1})",
                field,
            )
    return tuple(ids)


def completion_budget(
    prompt_tokens: int, max_tokens: int | None, default: int, context: int, field: str, limit: str = "max_tokens"
) -> int:
    """The tokens a request may generate: its ``max_tokens`` (given as ``limit``) when the prompt (``field``) and they
    fit the model's ``context``, else BadRequest naming the numbers; left out, ``default`` capped by the room the
    prompt leaves."""
    room = context - prompt_tokens
    if room < 1:
        raise BadRequest(
            f"{field}: the prompt has {prompt_tokens} tokens, which leaves no room in the model's {context}-token "
            f"context; shorten it to at most {context - 1} tokens",
            field,
        )
    if max_tokens is None:
        return min(default, room)
    if max_tokens > room:
        raise BadRequest(
            f"{limit}: the prompt's {prompt_tokens} tokens + {limit} {max_tokens} = {prompt_tokens + max_tokens} "
            f"exceed the model's {context}-token context; give {limit} <= {room} or a shorter prompt",
            limit,
        )
    return max_tokens


def wait_seconds(query: Any, default: float) -> float:
    """``?wait_s=`` of a long-poll, in seconds (``default`` when absent), held within 0..MAX_CLAIM_WAIT_S; BadRequest
    when it is not a finite number."""
    raw = query.get("wait_s")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise BadRequest(f"wait_s: give a number of seconds (at most {MAX_CLAIM_WAIT_S}), got {raw!r}", "wait_s")
    return min(max(value, 0.0), MAX_CLAIM_WAIT_S)


def _within(value: float, minimum: float, maximum: float | None) -> bool:
    return value >= minimum and (maximum is None or value <= maximum)


def _bounds(minimum: float, maximum: float | None, *, above: bool = False) -> str:
    """`` >= minimum and <= maximum`` (the parts that bound anything)."""
    parts = [f"{'>' if above else '>='} {minimum}"] if minimum > -math.inf else []
    parts += [f"<= {maximum}"] if maximum is not None else []
    return " " + " and ".join(parts) if parts else ""
