"""Chat templates: a conversation of messages rendered to token ids, and rendered incrementally as it grows.

:func:`chat_template_for` picks the template of a tokenizer: a Hugging Face tokenizer's own chat template
(``apply_chat_template``, local files only; :class:`HFChatTemplate`), or for the built-in CharTokenizer the
:class:`CharChatTemplate` below, whose alphabet has no room for role markers:

    <bos> then, per message: system/user/tool -> content "="; assistant -> content <eos>

so ``[user "12*34", assistant "12*34", tool "408", assistant "408"]`` renders as ``<bos>12*34=12*34<eos>408=408<eos>``.
The generation prompt is empty (a user or tool message already ends with "=", the cue to answer).

:class:`ChatSession` keeps the token ids of a growing conversation: the model's sampled tokens are appended as they
are (never re-rendered), and an observation appends only the tokens the template adds after the last message, so
the prefix the model was conditioned on stays token-identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from sc_lightning.tokenizer import CharTokenizer, HuggingFaceTokenizer, Tokenizer

Role = Literal["system", "user", "assistant", "tool"]


class ChatTemplateError(ValueError):
    """A conversation cannot be rendered: an unknown role, or a template that rewrites earlier turns."""


@dataclass(frozen=True)
class Message:
    """One message of a conversation: who sent it (``role``) and its text."""

    role: Role
    content: str


class ChatTemplate(Protocol):
    """Renders a whole conversation to token ids."""

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> list[int]:
        """Token ids of ``messages``; with ``add_generation_prompt`` also the tokens that cue the model's turn."""


class CharChatTemplate:
    """The built-in template of the CharTokenizer (see the module doc)."""

    def __init__(self, tokenizer: CharTokenizer) -> None:
        self._tok = tokenizer

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> list[int]:
        """``<bos>``, then each message's content followed by ``=`` (or ``<eos>`` after an assistant message)."""
        ids = [self._tok.bos_token_id]
        for message in messages:
            if message.role not in ("system", "user", "assistant", "tool"):
                raise ChatTemplateError(f"unknown message role {message.role!r}")
            ids += self._tok.encode(message.content)
            ids += [self._tok.eos_token_id] if message.role == "assistant" else self._tok.encode("=")
        return ids


class HFChatTemplate:
    """A ``transformers`` tokenizer's own chat template (its ``chat_template``), rendered with its special tokens."""

    def __init__(self, tokenizer: HuggingFaceTokenizer) -> None:
        hf_tokenizer = tokenizer.transformers_tokenizer
        if not getattr(hf_tokenizer, "chat_template", None):
            raise ChatTemplateError(f"tokenizer {tokenizer.name!r} has no chat template; multi-turn rollouts need one")
        self._checker = tokenizer
        self._tok = hf_tokenizer

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> list[int]:
        """``apply_chat_template`` of the messages, tokenized; UnrepresentableTextError for a message's content the
        tokenizer cannot represent (the template would silently lose it)."""
        for message in messages:
            self._checker.encode(message.content)
        rendered = self._tok.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
            return_dict=False,
        )
        return [int(i) for i in rendered]


def chat_template_for(tokenizer: Tokenizer) -> ChatTemplate:
    """The chat template of ``tokenizer``: the built-in one for CharTokenizer, the tokenizer's own otherwise."""
    if isinstance(tokenizer, CharTokenizer):
        return CharChatTemplate(tokenizer)
    if isinstance(tokenizer, HuggingFaceTokenizer):
        return HFChatTemplate(tokenizer)
    raise ChatTemplateError(f"no chat template for {tokenizer!r}: use a CharTokenizer or a Hugging Face tokenizer")


def user_prompt_ids(template: ChatTemplate, text: str) -> tuple[int, ...]:
    """``text`` as the opening user message rendered by ``template``, the generation prompt added."""
    return tuple(template.render([Message("user", text)], add_generation_prompt=True))


class ChatSession:
    """The token ids of a growing conversation, extended by model turns and observations (see the module doc)."""

    def __init__(self, template: ChatTemplate, messages: Sequence[Message]) -> None:
        self._template = template
        self.messages = list(messages)
        self.token_ids = template.render(self.messages, add_generation_prompt=True)

    def add_model_turn(self, text: str, token_ids: Sequence[int]) -> None:
        """Record the model's turn: its sampled ``token_ids`` are appended unchanged, ``text`` as its message."""
        self.messages.append(Message("assistant", text))
        self.token_ids += [int(i) for i in token_ids]

    def add_observation(self, message: Message) -> list[int]:
        """Append ``message`` and the next generation prompt; returns only the new token ids.

        ChatTemplateError when the template renders the earlier conversation differently once ``message`` follows
        (it would change tokens the model already saw).
        """
        before = self._template.render(self.messages, add_generation_prompt=False)
        self.messages.append(message)
        after = self._template.render(self.messages, add_generation_prompt=True)
        if after[: len(before)] != before:
            raise ChatTemplateError(
                f"the chat template rewrites earlier turns when a {message.role} message follows; "
                "multi-turn rollouts need a template that only appends"
            )
        new = after[len(before) :]
        self.token_ids += new
        return new
