"""A simple driver of one multi-turn conversation: generate, ask the environment, append, until a reward or a limit.

The rollout manager will run this loop asynchronously across many conversations; here ``generate`` is any callable
``(token_ids, max_new_tokens) -> Generation`` (an engine, a model's forward, or a scripted fake in tests). The
conversation starts from the prompt's text as a ``user`` message rendered by the chat template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sc_lightning.rollout.envs.base import Score, as_score
from sc_lightning.rollout.multiturn.chat import ChatSession, ChatTemplate, Message
from sc_lightning.rollout.multiturn.conversation import Conversation, ConversationAssembler
from sc_lightning.rollout.multiturn.protocol import MultiTurnEnvironment, Observation, TurnLimits
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import Generation, Prompt

Generate = Callable[[tuple[int, ...], int], Generation]
EndReason = Literal["reward", "max_turns", "token_budget"]


@dataclass(frozen=True)
class ConversationOutcome:
    """A finished conversation: its token record, its messages, its score and what ended it."""

    conversation: Conversation
    messages: tuple[Message, ...]
    score: Score
    ended_by: EndReason


def run_conversation(
    prompt: Prompt,
    environment: MultiTurnEnvironment,
    template: ChatTemplate,
    tokenizer: Tokenizer,
    generate: Generate,
    limits: TurnLimits,
) -> ConversationOutcome:
    """Play one conversation of ``prompt`` to its end; a conversation out of turns or tokens scores 0.0."""
    episode = environment.start(prompt)
    session = ChatSession(template, [Message("user", prompt.text)])
    assembler = ConversationAssembler(session.token_ids)

    def ended(score: Score, reason: EndReason) -> ConversationOutcome:
        """The outcome of the conversation as it stands, with ``score`` and ``reason``."""
        return ConversationOutcome(assembler.build(), tuple(session.messages), score, reason)

    for _ in range(limits.max_turns):
        budget = limits.max_tokens - len(assembler)
        if budget <= 0:
            return ended(Score(0.0), "token_budget")
        generation = generate(assembler.token_ids, budget)
        assembler.add_model_turn(generation)
        text = tokenizer.decode(generation.token_ids)
        session.add_model_turn(text, generation.token_ids)
        verdict = episode.step(text)
        if not isinstance(verdict, Observation):
            return ended(as_score(verdict), "reward")
        new_ids = session.add_observation(Message(verdict.role, verdict.text))
        if len(assembler) + len(new_ids) > limits.max_tokens:
            return ended(Score(0.0), "token_budget")
        assembler.add_observation(new_ids)
    return ended(Score(0.0), "max_turns")
