"""The JSON bodies the endpoint accepts, parsed into token ids, sampling settings and rewards (no HTTP here).

Each parser raises :class:`BadRequest` naming the field and what is wrong (the checks of each field are in
:mod:`~sc_lightning.rollout.serving.validation`); the server answers it with a 400.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

from sc_lightning.rollout.envs.base import Score
from sc_lightning.rollout.multiturn.chat import ChatTemplate, Message, Role
from sc_lightning.rollout.serving import validation
from sc_lightning.rollout.serving.validation import UNSERVED_CHAT, UNSERVED_COMPLETIONS, BadRequest, json_object
from sc_lightning.tokenizer import Tokenizer, prompt_token_ids
from sc_lightning.types import SamplingParams

ROLES = get_args(Role)
PINNED_IN_ROLLOUTS = ("temperature", "top_p", "top_k")  # the loss's logprobs assume the run's sampling


@dataclass(frozen=True)
class ModelRequest:
    """A parsed completions or chat request: the prompt's ids, how to sample, and the rollout it belongs to."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    rollout_id: str | None
    seeded: bool  # the body gave a seed
    max_tokens_field: str | None = None  # the field that gave max_tokens: it must fit the context, else it is capped
    messages: tuple[Message, ...] | None = None  # a chat request's, as sent


def parse_completion_request(body: Any, tokenizer: Tokenizer, defaults: SamplingParams) -> ModelRequest:
    """A ``/v1/completions`` body: ``prompt`` (text, encoded as dataset prompts are, or token ids of the tokenizer's
    vocabulary; a batch of one of either is one prompt) and sampling."""
    body = json_object(body)
    validation.refuse_unserved(body, UNSERVED_COMPLETIONS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        try:
            ids = prompt_token_ids(tokenizer, prompt)
        except ValueError as err:  # text the tokenizer cannot encode
            raise BadRequest(f"prompt: {err}", "prompt") from None
        if not ids:
            raise BadRequest("prompt: the text encodes to no tokens; give a non-empty prompt", "prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise BadRequest(
            f"prompt: a batch of {len(prompt)} prompts is not served; send one prompt per request", "prompt"
        )
    elif isinstance(prompt, list):
        ids = validation.token_ids(prompt, "prompt", tokenizer.vocab_size)
    else:
        raise BadRequest("prompt: give a string or a non-empty list of token ids", "prompt")
    return _model_request(body, ids, defaults)


def parse_chat_request(body: Any, template: ChatTemplate, defaults: SamplingParams) -> ModelRequest:
    """A ``/v1/chat/completions`` body: ``messages`` rendered by ``template`` with the generation prompt added."""
    body = json_object(body)
    validation.refuse_unserved(body, UNSERVED_CHAT)
    validation.boolean(body, "logprobs")  # the sampled tokens' logprobs come back either way
    messages = parse_messages(body.get("messages"))
    try:
        ids = tuple(template.render(messages, add_generation_prompt=True))
    except ValueError as err:  # a ChatTemplateError, or text the tokenizer cannot encode
        raise BadRequest(f"messages: {err}", "messages") from None
    return dataclasses.replace(_model_request(body, ids, defaults), messages=tuple(messages))


def parse_messages(raw: Any) -> list[Message]:
    """OpenAI-style ``messages``: role and content (a string, or a list of ``{"type": "text"}`` parts)."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: give a non-empty list of {role, content} objects", "messages")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}].role: must be one of {', '.join(ROLES)}", f"messages[{i}].role")
        messages.append(Message(message["role"], _content(message.get("content"), f"messages[{i}].content")))
    return messages


def _content(content: Any, field: str) -> str:
    if content is None:
        return ""  # an assistant message that only called tools
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(_text_part(p) for p in content):
        return "".join(part["text"] for part in content)
    raise BadRequest(f"{field}: give a string or a list of text parts ({{'type': 'text', 'text': str}})", field)


def _text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def parse_reward(body: Any) -> Score:
    """A ``/v1/rollouts/{id}/reward`` body: a finite ``reward`` and an optional ``mask_sample`` flag."""
    body = json_object(body)
    if body.get("reward") is None:
        raise BadRequest("reward: give a finite number", "reward")
    reward = validation.number(body, "reward")
    assert reward is not None
    mask = body.get("mask_sample", False)
    if not isinstance(mask, bool):
        raise BadRequest(f"mask_sample: give true or false, got {mask!r}", "mask_sample")
    return Score(reward, mask)


def pin_rollout_sampling(body: dict[str, Any], sampling: SamplingParams, run: SamplingParams) -> None:
    """A rollout's calls sample as the run does: BadRequest naming a field the body gives that differs from the
    run's value."""
    for name in PINNED_IN_ROLLOUTS:
        if body.get(name) is not None and getattr(sampling, name) != getattr(run, name):
            raise BadRequest(
                f"{name}: a call of a training rollout samples with the run's {name}={getattr(run, name)!r} "
                f"(policy.generation.{name}), got {body[name]!r}; leave it out",
                name,
            )


def _model_request(body: dict[str, Any], ids: Sequence[int], defaults: SamplingParams) -> ModelRequest:
    rollout_id = body.get("rollout_id")
    if rollout_id is not None and not isinstance(rollout_id, str):
        raise BadRequest("rollout_id: give the string GET /v1/rollouts/next returned", "rollout_id")
    max_tokens = validation.max_tokens(body)
    temperature, top_p = validation.temperature(body), validation.number(body, "top_p", 0.0, 1.0, above=True)
    seed = validation.integer(body, "seed", 0, validation.MAX_SEED)
    sampling = SamplingParams(
        max_new_tokens=defaults.max_new_tokens if max_tokens is None else max_tokens,
        temperature=defaults.temperature if temperature is None else temperature,
        top_p=defaults.top_p if top_p is None else top_p,
        top_k=validation.top_k(body) if body.get("top_k") is not None else defaults.top_k,
        seed=seed,
    )
    if rollout_id is not None:
        pin_rollout_sampling(body, sampling, defaults)
    limit = "max_tokens" if body.get("max_tokens") is not None else "max_completion_tokens"
    return ModelRequest(
        tuple(ids),
        sampling,
        rollout_id,
        seeded=seed is not None,
        max_tokens_field=None if max_tokens is None else limit,
    )
