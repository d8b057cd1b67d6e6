"""Chat templates render conversations, and an observation only appends: the earlier tokens stay identical."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_lightning.models.tiny_tokenizer import CHAR_CHAT_TEMPLATE, save_char_tokenizer
from sc_lightning.rollout.multiturn.chat import (
    CharChatTemplate,
    ChatSession,
    ChatTemplateError,
    HFChatTemplate,
    Message,
    chat_template_for,
)
from sc_lightning.tokenizer import CharTokenizer, load_tokenizer

CONVERSATION = [
    Message("user", "12*34"),
    Message("assistant", "12*34"),
    Message("tool", "408"),
    Message("assistant", "408"),
]


def _play(template, tokenizer) -> ChatSession:  # noqa: ANN001 - any template and its tokenizer
    session = ChatSession(template, CONVERSATION[:1])
    for message in CONVERSATION[1:]:
        if message.role == "assistant":
            session.add_model_turn(message.content, [*tokenizer.encode(message.content), tokenizer.eos_token_id])
        else:
            before = list(session.token_ids)
            new = session.add_observation(message)
            assert session.token_ids == before + new  # only appended
    return session


def test_char_template_renders_the_documented_layout() -> None:
    tok = CharTokenizer()
    ids = CharChatTemplate(tok).render(CONVERSATION, add_generation_prompt=True)
    assert ids == [tok.BOS, *tok.encode("12*34=12*34"), tok.EOS, *tok.encode("408=408"), tok.EOS]


def test_incremental_rendering_equals_full_rendering() -> None:
    tok = CharTokenizer()
    template = chat_template_for(tok)
    session = _play(template, tok)
    assert session.token_ids == template.render(CONVERSATION, add_generation_prompt=True)


def test_hf_template_from_local_files_matches_the_builtin(tmp_path: Path) -> None:
    save_char_tokenizer(tmp_path)
    hf = load_tokenizer(str(tmp_path))
    assert hf.transformers_tokenizer.chat_template == CHAR_CHAT_TEMPLATE  # saved with it (warm starts use it)
    template = chat_template_for(hf)
    assert isinstance(template, HFChatTemplate)
    session = _play(template, hf)
    assert session.token_ids == CharChatTemplate(CharTokenizer()).render(CONVERSATION, add_generation_prompt=True)


def test_a_template_that_rewrites_history_is_rejected() -> None:
    class FakeRewritingTemplate:
        """A fake template that drops the first message once the conversation has three (a rewriting template)."""

        def render(self, messages, *, add_generation_prompt: bool) -> list[int]:  # noqa: ANN001
            kept = messages[1:] if len(messages) > 2 else messages
            return [len(m.content) for m in kept]

    session = ChatSession(FakeRewritingTemplate(), CONVERSATION[:1])
    session.add_model_turn("12*34", [1])
    with pytest.raises(ChatTemplateError, match="rewrites"):
        session.add_observation(Message("tool", "408"))


def test_a_tokenizer_without_template_is_rejected(tmp_path: Path) -> None:
    save_char_tokenizer(tmp_path)
    hf = load_tokenizer(str(tmp_path))
    hf.transformers_tokenizer.chat_template = None  # a model directory saved without one
    with pytest.raises(ChatTemplateError, match="no chat template"):
        chat_template_for(hf)
