"""The JSON bodies the endpoint accepts, parsed into token ids, sampling settings and rewards (no HTTP here).

Each parser raises :class:`BadRequest` naming the field and what is wrong; the server answers it with a 400.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

from sc_lightning.rollout.envs.base import Score
from sc_lightning.rollout.multiturn.chat import ChatTemplate, Message, Role
from sc_lightning.tokenizer import Tokenizer, UnrepresentableTextError, prompt_token_ids
from sc_lightning.types import SamplingParams

ROLES = get_args(Role)
PINNED_IN_ROLLOUTS = ("temperature", "top_p", "top_k")  # the loss's logprobs assume the run's sampling


class BadRequest(ValueError):
    """A request the endpoint cannot serve; the message says which field and why."""


@dataclass(frozen=True)
class ModelRequest:
    """A parsed completions or chat request: the prompt's ids, how to sample, and the rollout it belongs to."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    rollout_id: str | None
    seeded: bool  # the body gave a seed
    messages: tuple[Message, ...] | None = None  # a chat request's, as sent


def parse_completion_request(body: Any, tokenizer: Tokenizer, defaults: SamplingParams) -> ModelRequest:
    """A ``/v1/completions`` body: ``prompt`` (text, encoded as dataset prompts are, or token ids) and sampling."""
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        try:
            ids = prompt_token_ids(tokenizer, prompt)
        except UnrepresentableTextError as err:
            raise BadRequest(f"prompt: {err}") from None
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = tuple(prompt)
    else:
        raise BadRequest("prompt: give a string or a non-empty list of token ids")
    return _model_request(body, ids, defaults)


def parse_chat_request(body: Any, template: ChatTemplate, defaults: SamplingParams) -> ModelRequest:
    """A ``/v1/chat/completions`` body: ``messages`` rendered by ``template`` with the generation prompt added."""
    body = _object(body)
    messages = parse_messages(body.get("messages"))
    try:
        ids = tuple(template.render(messages, add_generation_prompt=True))
    except ValueError as err:  # a ChatTemplateError, or text the tokenizer cannot encode
        raise BadRequest(f"messages: {err}") from None
    return dataclasses.replace(_model_request(body, ids, defaults), messages=tuple(messages))


def parse_messages(raw: Any) -> list[Message]:
    """OpenAI-style ``messages``: role and content (a string, or a list of ``{"type": "text"}`` parts)."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: give a non-empty list of {role, content} objects")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}].role: must be one of {', '.join(ROLES)}")
        messages.append(Message(message["role"], _content(message.get("content"), f"messages[{i}].content")))
    return messages


def _content(content: Any, field: str) -> str:
    if content is None:
        return ""  # an assistant message that only called tools
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(part.get("text", "")) for part in content)
    raise BadRequest(f"{field}: give a string or a list of text parts")


def parse_reward(body: Any) -> Score:
    """A ``/v1/rollouts/{id}/reward`` body: a finite ``reward`` and an optional ``mask_sample`` flag."""
    body = _object(body)
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise BadRequest(f"reward: give a finite number, got {reward!r}")
    mask = body.get("mask_sample", False)
    if not isinstance(mask, bool):
        raise BadRequest(f"mask_sample: give true or false, got {mask!r}")
    return Score(float(reward), mask)


def pin_rollout_sampling(body: dict[str, Any], run: SamplingParams) -> None:
    """A rollout's calls sample as the run does: BadRequest naming a field that differs from the run's value."""
    for name in PINNED_IN_ROLLOUTS:
        if name in body and body[name] != getattr(run, name):
            raise BadRequest(
                f"{name}: a call of a training rollout samples with the run's {name}={getattr(run, name)!r} "
                f"(policy.generation.{name}), got {body[name]!r}; leave it out"
            )


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _model_request(body: dict[str, Any], ids: Sequence[int], defaults: SamplingParams) -> ModelRequest:
    if body.get("n", 1) != 1:
        raise BadRequest("n: only 1 completion per request is served (send several requests)")
    rollout_id = body.get("rollout_id")
    if rollout_id is not None and not isinstance(rollout_id, str):
        raise BadRequest("rollout_id: give the string GET /v1/rollouts/next returned")
    if rollout_id is not None:
        pin_rollout_sampling(body, defaults)
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
    return ModelRequest(tuple(ids), sampling, rollout_id, seeded="seed" in body)
