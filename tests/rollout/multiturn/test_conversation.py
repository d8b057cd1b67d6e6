"""The conversation record stays aligned however turns are interleaved, and rejects misaligned arrays."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.rollout.multiturn.conversation import NO_VERSION, Conversation, ConversationAssembler, TurnSpan
from sc_lightning.types import Generation

ids = st.lists(st.integers(0, 50), max_size=6)
model_turn = st.builds(
    lambda toks, version: Generation(tuple(toks), tuple(-0.5 - i for i in range(len(toks))), "stop", version),
    ids,
    st.integers(0, 5),
)
step = st.one_of(model_turn, ids)


@given(prompt=ids, steps=st.lists(step, max_size=8))
def test_arrays_stay_aligned_for_any_turn_sequence(prompt: list[int], steps: list) -> None:
    assembler = ConversationAssembler(prompt)
    expected: list[tuple[int, bool, int]] = [(t, False, NO_VERSION) for t in prompt]
    last = NO_VERSION
    for item in steps:
        if isinstance(item, Generation):
            assembler.add_model_turn(item)
            last = item.weight_version
            expected += [(t, True, item.weight_version) for t in item.token_ids]
        else:
            assembler.add_observation(item)
            expected += [(t, False, last) for t in item]
    conv = assembler.build()
    assert list(zip(conv.token_ids, conv.trainable, conv.token_versions, strict=True)) == expected
    assert len(conv.logprobs) == len(conv.token_ids)
    model_logprobs = [lp for lp, keep in zip(conv.logprobs, conv.trainable, strict=True) if keep]
    assert model_logprobs == [lp for g in steps if isinstance(g, Generation) for lp in g.logprobs]
    assert conv.prompt_length == len(prompt)
    assert conv.model_turns == sum(isinstance(g, Generation) for g in steps)
    assert [s.role for s in conv.turns] == ["prompt"] + ["model" if isinstance(g, Generation) else "env" for g in steps]


def test_refit_between_turns_is_recorded_and_env_tokens_follow_their_turn() -> None:
    assembler = ConversationAssembler([2, 3])
    assembler.add_model_turn(Generation((4, 5), (-0.1, -0.2), "stop", 7))
    assembler.add_observation([6])
    assembler.add_model_turn(Generation((8,), (-0.3,), "stop", 8))
    conv = assembler.build()
    assert conv.token_versions == (-1, -1, 7, 7, 7, 8)
    assert conv.trainable == (False, False, True, True, False, True)
    assert conv.logprobs == (0.0, 0.0, -0.1, -0.2, 0.0, -0.3)


def test_misaligned_record_is_rejected() -> None:
    with pytest.raises(ValueError, match="token_versions"):
        Conversation((1, 2), (False, True), (0.0, -1.0), (0,), (TurnSpan("prompt", 0, 2),))
    with pytest.raises(ValueError, match="cover"):
        Conversation((1, 2), (False, True), (0.0, -1.0), (0, 0), (TurnSpan("prompt", 0, 1),))
