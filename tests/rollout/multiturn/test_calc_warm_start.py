"""builtin:tiny-calc warm-starts on exactly the conversations the calculator environment and chat template produce."""

from __future__ import annotations

from sc_lightning.models.warm_start import _examples
from sc_lightning.rollout.multiturn.chat import CharChatTemplate, Message
from sc_lightning.rollout.multiturn.conversation import ConversationAssembler
from sc_lightning.rollout.multiturn.tools import calculator
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.types import Generation


def test_warm_start_rows_are_rendered_conversations_with_the_trainable_mask() -> None:
    tok = CharTokenizer()
    rows, masks = _examples(tok, 16, seed=3, task="calculator")
    template = CharChatTemplate(tok)
    for row, mask in zip(rows.tolist(), masks.tolist(), strict=True):
        length = len(row) - row[::-1].index(tok.EOS)  # through the last eos; the rest is padding
        call = tok.decode(row[1:6])
        product = calculator(call)
        messages = [Message("user", call), Message("assistant", call), Message("tool", product)]
        messages.append(Message("assistant", product))
        assert row[:length] == template.render(messages, add_generation_prompt=True)
        assembler = ConversationAssembler(template.render(messages[:1], add_generation_prompt=True))
        assembler.add_model_turn(Generation((*tok.encode(call), tok.EOS), (0.0,) * 6, "stop", 0))
        assembler.add_observation(tok.encode(f"{product}="))
        ids = (*tok.encode(product), tok.EOS)
        assembler.add_model_turn(Generation(ids, (0.0,) * len(ids), "stop", 0))
        assert list(assembler.build().trainable) == mask[:length] and not any(mask[length:])
