"""A chat call continuing a model turn: the template's unsampled end-of-turn tokens, then the new messages."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sc_lightning.rollout.chat_continuation import ChatTurn, ContinuationError, continuation_ids
from sc_lightning.rollout.multiturn.chat import Message

END, NEWLINE, CUE = 90, 91, 92


class TwoTokenEnd:
    """A Qwen-like template of one token per message character: an assistant turn is CUE, its content, END NEWLINE;
    any other message its content then NEWLINE; the generation prompt is CUE (the assistant turn's header)."""

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> list[int]:
        ids: list[int] = []
        for message in messages:
            assistant = message.role == "assistant"
            ids += [CUE] * assistant + [ord(c) for c in message.content] + ([END, NEWLINE] if assistant else [NEWLINE])
        return ids + ([CUE] if add_generation_prompt else [])


USER = Message("user", "a")


@pytest.mark.parametrize(
    ("sampled", "closing"),
    [((ord("b"), END), [NEWLINE]), ((ord("b"),), [END, NEWLINE]), ((ord("b"), END, NEWLINE), [])],
)
def test_only_the_end_of_turn_tokens_the_model_did_not_sample_are_added(sampled: tuple, closing: list) -> None:
    turn = ChatTurn((USER,), sampled, "b")
    tool = Message("tool", "c")
    ids = continuation_ids(TwoTokenEnd(), turn, [USER, Message("assistant", "b"), tool])
    assert ids == [*closing, ord("c"), NEWLINE, CUE]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([Message("user", "z"), Message("assistant", "b"), Message("tool", "c")], r"messages\[0\] differs from the"),
        ([USER, Message("assistant", "B"), Message("tool", "c")], r"messages\[1\] differs from the model's turn"),
        ([USER], r"messages\[1\] must be the model's turn"),
    ],
)
def test_messages_that_do_not_continue_the_conversation_are_named(messages: list, message: str) -> None:
    with pytest.raises(ContinuationError, match=message):
        continuation_ids(TwoTokenEnd(), ChatTurn((USER,), (ord("b"), END), "b"), messages)
