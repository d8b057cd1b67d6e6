"""Multi-turn rollouts (issue 21, foundations): the conversation record, chat templates, tools and environments.

``MultiTurnSource`` (source.py) plays them with the served engine as the rollout manager's sample source; see
docs/multiturn.md. Importing the package
registers the built-in multi-turn environments (``calculator``).
"""

from sc_lightning.rollout.multiturn.calculator import CalculatorEnvironment, calculator_prompts
from sc_lightning.rollout.multiturn.chat import ChatSession, Message, chat_template_for
from sc_lightning.rollout.multiturn.conversation import Conversation, ConversationAssembler
from sc_lightning.rollout.multiturn.driver import ConversationOutcome, run_conversation
from sc_lightning.rollout.multiturn.protocol import (
    Episode,
    MultiTurnEnvironment,
    Observation,
    TurnLimits,
    build_multiturn_environment,
)
from sc_lightning.rollout.multiturn.source import MultiTurnSource

__all__ = [
    "CalculatorEnvironment",
    "ChatSession",
    "Conversation",
    "ConversationAssembler",
    "ConversationOutcome",
    "Episode",
    "Message",
    "MultiTurnEnvironment",
    "MultiTurnSource",
    "Observation",
    "TurnLimits",
    "build_multiturn_environment",
    "calculator_prompts",
    "chat_template_for",
    "run_conversation",
]
