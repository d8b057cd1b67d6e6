"""How an agent's next chat call continues a conversation whose model turn is known token by token.

An agent sends text: the model's last turn comes back as the ``content`` the endpoint decoded, and re-encoding text is
not always the identity (a special token the decoder drops, a tokenizer that merges differently). So a rollout's
later chat call is not re-rendered whole: its messages must repeat the earlier call's messages and the model's turn
as returned, and only what follows is rendered — the template's end-of-turn tokens the model did not sample (an
``<eos>`` after a turn cut at ``max_tokens``), then the new messages and the next generation prompt — and appended
to the exact tokens of the conversation so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sc_lightning.rollout.multiturn.chat import ChatTemplate, Message


class ContinuationError(ValueError):
    """The messages do not continue the conversation (an earlier message or the model's turn differs)."""


@dataclass(frozen=True)
class ChatTurn:
    """A chat call's messages and the model's turn that answered them (its token ids and decoded text)."""

    messages: tuple[Message, ...]
    token_ids: tuple[int, ...]
    text: str


def continuation_ids(template: ChatTemplate, turn: ChatTurn, messages: Sequence[Message]) -> list[int]:
    """The tokens that follow ``turn``'s token ids when the conversation reads as ``messages`` (module doc).

    ContinuationError naming the first message that differs; ``ChatTemplateError`` (a ValueError) when the template
    renders the earlier conversation differently once the new messages follow.
    """
    history, answer = list(turn.messages), Message("assistant", turn.text)
    for i, (sent, known) in enumerate(zip(messages, [*history, answer], strict=False)):
        if sent != known:
            what = "the model's turn as returned (its content)" if i == len(history) else "the earlier call's"
            raise ContinuationError(f"messages[{i}] differs from {what}; resend the history unchanged")
    if len(messages) <= len(history):
        raise ContinuationError(f"messages[{len(history)}] must be the model's turn as returned, then new messages")
    cue = template.render(history, add_generation_prompt=True)
    with_turn = template.render([*history, answer], add_generation_prompt=False)
    after = template.render(list(messages), add_generation_prompt=True)
    if with_turn[: len(cue)] != cue or after[: len(with_turn)] != with_turn:
        raise ContinuationError("the chat template rewrites earlier turns when these messages follow")
    closing = template.render([*history, Message("assistant", "")], add_generation_prompt=False)[len(cue) :]
    sampled = next(k for k in range(len(closing), -1, -1) if _ends_with(turn.token_ids, closing[:k]))
    return closing[sampled:] + after[len(with_turn) :]


def _ends_with(ids: Sequence[int], tail: Sequence[int]) -> bool:
    return not tail or tuple(ids[-len(tail) :]) == tuple(tail)
