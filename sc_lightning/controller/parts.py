"""What a SingleController is made of: the parts it drives and the settings the config decides.

``build.py`` fills both from a validated config; the controller takes them as its two constructor arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from sc_lightning.controller.buffer import TQReplayBuffer
from sc_lightning.controller.drops import DropBudgets
from sc_lightning.controller.dynamic_sampling import DynamicSampling
from sc_lightning.controller.recovery import RecoveryPolicy
from sc_lightning.controller.reserve import ReplacementReserve
from sc_lightning.controller.samplers import PromptGroupSampler
from sc_lightning.controller.validation import Validator
from sc_lightning.rollout.manager import RolloutManager
from sc_lightning.rollout.prompts import PromptStream


@dataclass(frozen=True)
class ControllerParts:
    """The objects the controller drives: the buffer, the sampler, the rollout manager and the prompt stream.

    The manager's ``served`` policy (the engine and the version new rollouts are stamped with) is the controller's:
    the controller advances it at each refit, the manager only reads it. ``reserve``: the replacement reserve of
    spare prompts (empty unless ``on_dropped_prompt: replace``). ``dynamic_sampling``: filter zero-reward-variance
    groups and refill their slots (``dynamic_sampling.py``). ``validator``: validations pinned to one weight version
    each (``validation.py``); None: the run validates nothing.
    """

    buffer: TQReplayBuffer
    sampler: PromptGroupSampler
    manager: RolloutManager
    prompts: PromptStream
    reserve: ReplacementReserve
    dynamic_sampling: DynamicSampling | None = None
    validator: Validator | None = None


@dataclass(frozen=True)
class ControllerSettings:
    """The controller's capacities, deadlines and policies, from ``async_rl``, ``rollout_recovery`` and the algorithm.

    ``drain_timeout_s``: the drain gate's deadline (None: refits leave generations in flight,
    ``async_rl.in_flight_weight_updates: true``). ``warmup_window = (start_step, lookahead)``: PPO critic warm-up —
    the sampler was built with the wider warm-up lookahead; once the trainer reaches ``start_step`` its gate window
    narrows to ``lookahead``.
    """

    max_buffered_rollouts: int  # buffer permits: groups dispatched and not yet selected or evicted
    max_inflight_prompts: int  # in-flight permits: rollouts generating
    recovery: RecoveryPolicy  # how an unfinished group is redispatched, and whether generations are captured
    drop_budgets: DropBudgets  # how many groups whose retries are spent may be dropped
    drain_timeout_s: float | None = None
    warmup_window: tuple[int, int] | None = None
