"""The one driver of a multi-turn conversation: generate, ask the environment, append, until a reward or a limit.

``run_conversation`` is async: ``generate`` is any awaitable ``(token_ids, max_new_tokens, turn) -> Generation``
(the served engine under a per-turn deadline in :mod:`sc_lightning.rollout.multiturn.source`, a scripted fake in
tests) and ``step`` runs one episode step (by default in a worker thread; the sample source adds ``env_timeout_s``).
The conversation starts from the prompt's own token ids, which must be its text rendered as a ``user`` message by
the chat template (the row's prompt is ``prompt.token_ids``): a prompt that is not is a ChatTemplateError naming it.
Given a :class:`~sc_lightning.rollout.multiturn.record.TurnRecord`, the conversation goes on after its sealed turns
(replayed through the fresh episode, not generated) and seals each new turn into it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from sc_lightning.rollout.envs.base import Score, as_score
from sc_lightning.rollout.envs.daemon_call import daemon_call
from sc_lightning.rollout.multiturn.chat import ChatSession, ChatTemplate, ChatTemplateError, Message
from sc_lightning.rollout.multiturn.conversation import Conversation, ConversationAssembler
from sc_lightning.rollout.multiturn.protocol import Episode, MultiTurnEnvironment, Observation, TurnLimits
from sc_lightning.rollout.multiturn.record import ReplayDiverged, SealedTurn, TurnRecord
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import FinishReason, Generation, Prompt

Generate = Callable[[tuple[int, ...], int, int], Awaitable[Generation]]
Verdict = Observation | float | Score
Step = Callable[[Episode, str, int], Awaitable[Verdict]]
EndReason = Literal["reward", "max_turns", "token_budget"]


@dataclass(frozen=True)
class ConversationOutcome:
    """A finished conversation: its token record, its messages, its score, what ended it and the last turn's
    finish reason."""

    conversation: Conversation
    messages: tuple[Message, ...]
    score: Score
    ended_by: EndReason
    finish_reason: FinishReason = "stop"


async def step_in_thread(episode: Episode, model_text: str, turn: int) -> Verdict:
    """Run ``episode.step`` on a daemon thread (no deadline; the sample source adds one)."""
    del turn
    return await daemon_call(episode.step, model_text)


def opening_session(prompt: Prompt, template: ChatTemplate) -> ChatSession:
    """The conversation's start: ``prompt.text`` as a user message, checked to render to ``prompt.token_ids``."""
    session = ChatSession(template, [Message("user", prompt.text)])
    if tuple(session.token_ids) != tuple(prompt.token_ids):
        raise ChatTemplateError(
            f"prompt {prompt.prompt_id}: its token ids are not its text rendered as a user message by the chat "
            "template; a multi-turn run needs prompts rendered by the template (data.dataset_name: calculator does)"
        )
    return session


async def run_conversation(
    prompt: Prompt,
    environment: MultiTurnEnvironment,
    template: ChatTemplate,
    tokenizer: Tokenizer,
    generate: Generate,
    limits: TurnLimits,
    step: Step = step_in_thread,
    record: TurnRecord | None = None,
) -> ConversationOutcome:
    """Play one conversation of ``prompt`` to its end; a conversation out of turns or tokens scores 0.0.

    With ``record``, its sealed turns are taken as they are (tokens, logprobs, versions) and replayed through the
    fresh episode to rebuild its state (an episode answering one differently is a ReplayDiverged naming the prompt
    and the turn); every turn after them is generated, and sealed into ``record`` once its observation is appended.
    """
    record = TurnRecord() if record is None else record
    session = opening_session(prompt, template)
    episode = await daemon_call(environment.start, prompt)
    assembler = ConversationAssembler(session.token_ids)
    finish: FinishReason = "stop"

    def ended(score: Score, reason: EndReason) -> ConversationOutcome:
        """The outcome of the conversation as it stands, with ``score`` and ``reason``."""
        return ConversationOutcome(assembler.build(), tuple(session.messages), score, reason, finish)

    for turn in range(1, limits.max_turns + 1):
        budget = limits.max_tokens - len(assembler)
        if budget <= 0:
            return ended(Score(0.0), "token_budget")
        sealed = record.turns[turn - 1] if turn <= len(record.turns) else None
        generation = sealed.generation if sealed is not None else await generate(assembler.token_ids, budget, turn)
        finish = generation.finish_reason
        assembler.add_model_turn(generation)
        text = tokenizer.decode(generation.token_ids)
        session.add_model_turn(text, generation.token_ids)
        verdict = await step(episode, text, turn)
        if sealed is not None and verdict != sealed.observation:
            raise ReplayDiverged(
                f"prompt {prompt.prompt_id}: turn {turn} replayed through a fresh {environment.name} episode was "
                f"answered {verdict!r}, not the recorded {sealed.observation!r}"
            )
        if not isinstance(verdict, Observation):
            return ended(as_score(verdict), "reward")
        new_ids = session.add_observation(Message(verdict.role, verdict.text))
        if len(assembler) + len(new_ids) > limits.max_tokens:
            return ended(Score(0.0), "token_budget")
        assembler.add_observation(new_ids)
        if sealed is None:
            record.turns.append(SealedTurn(generation, verdict))
    return ended(Score(0.0), "max_turns")
