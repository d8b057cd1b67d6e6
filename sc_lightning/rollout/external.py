"""External agents: prompt groups rolled out by an agent framework that runs its own loop over the HTTP endpoint.

:class:`ExternalRollouts` is the rollout manager's SampleSource in this mode (``env.name: external``). For each
sample of a dispatched group it opens a rollout (an id), queues it for an agent and waits for its reward; the
agent's side, served by :mod:`sc_lightning.rollout.serving.server`, is::

    GET  /v1/rollouts/next                      -> rollout_id, prompt_id, messages, text, prompt_token_ids
    POST /v1/chat/completions {"rollout_id"}   -> one model turn; any number of calls, tool messages between
    POST /v1/rollouts/{rollout_id}/reward       -> {"reward": r}: the sample is assembled and scored

Assembly (:class:`Transcript`): each call's prompt must begin with everything before it — the group's prompt ids
(the row's prompt), then every earlier call's completion and the tokens between calls. Tokens a call adds after that
(a tool message, the template's turn markers) are environment tokens: not trained, logprob 0.0, the version of the
model token before them (of the first model token, before the first turn). Model tokens keep the engine's logprobs
and token versions. A call that rewrites history is refused (409) and changes nothing.

Errors name the rollout id: an unknown id is a 404; a rollout not claimed yet, already finished, closed (its group
ended), busy with another call, or out of room (``policy.max_total_sequence_length``) a 409. A reward for a
rollout without any model token fails its prompt group as a data failure (RolloutError naming prompt, group and
rollout). Nothing waits forever: a sample waits within the manager's rollout deadline
(``async_rl.rollout_failure.rollout_timeout_s``, a config rule requires it), and when its group ends for any reason
its rollouts close, so the agent's next request about them gets a 409.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from sc_lightning.rollout.chat_continuation import ChatTurn
from sc_lightning.rollout.envs.base import Score
from sc_lightning.rollout.manager import RolloutError, Sample
from sc_lightning.types import FinishReason, Generation, Prompt

RECENTLY_CLOSED = 4096  # closed ids remembered, so a late request gets a 409 saying why instead of a 404


class RolloutStateError(Exception):
    """An agent's request that does not fit its rollout's state; ``status`` is the HTTP status (404 or 409)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Transcript:
    """The completion an agent's calls build after the prompt, with per-token flags, logprobs and versions."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.prompt_ids = tuple(prompt_ids)
        self.token_ids: list[int] = []
        self.trainable: list[bool] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.finish_reason: FinishReason = "stop"
        self.model_calls = 0

    @property
    def context(self) -> tuple[int, ...]:
        """Everything the next call's prompt must begin with."""
        return self.prompt_ids + tuple(self.token_ids)

    def mismatch(self, call_prompt: Sequence[int]) -> str | None:
        """Why ``call_prompt`` does not continue the transcript, or None."""
        context = self.context
        if tuple(call_prompt[: len(context)]) == context:
            return None
        at = next((i for i, (a, b) in enumerate(zip(call_prompt, context, strict=False)) if a != b), len(call_prompt))
        what = "the group's prompt" if at < len(self.prompt_ids) else "an earlier turn"
        return (
            f"its prompt differs from {what} at token {at} (the conversation so far has {len(context)} tokens); "
            "send the whole history unchanged, with new messages only appended"
        )

    def add_call(self, call_prompt: Sequence[int], generation: Generation) -> None:
        """Append the environment tokens ``call_prompt`` adds and the call's model tokens (``mismatch`` was None)."""
        between = [int(t) for t in call_prompt[len(self.context) :]]
        version = self.versions[-1] if self.versions else generation.weight_version
        self.token_ids += between + list(generation.token_ids)
        self.trainable += [False] * len(between) + [True] * len(generation.token_ids)
        self.logprobs += [0.0] * len(between) + list(generation.logprobs)
        self.versions += [version] * len(between) + list(generation.token_versions)
        self.finish_reason = generation.finish_reason
        self.model_calls += 1

    def generation(self) -> Generation:
        """The sample's generation: every token after the prompt, model tokens trainable."""
        first_model = self.trainable.index(True)
        return Generation(
            tuple(self.token_ids),
            tuple(self.logprobs),
            self.finish_reason,
            self.versions[first_model],
            tuple(self.versions),
            tuple(self.trainable),
        )


@dataclass
class ExternalRollout:
    """One sample of a prompt group handed to an agent: its id, prompt, transcript and the sample it ends with."""

    rollout_id: str
    prompt: Prompt
    group_id: str
    seed: int
    outcome: asyncio.Future[Sample]
    transcript: Transcript
    claimed: bool = False
    busy: bool = False  # a model call is in flight
    chat: ChatTurn | None = None  # the last call's messages and turn, when it was a chat call
    calls: int = 0  # model calls started, for per-call seeds

    def call_seed(self) -> int:
        """The seed of the next call that gives none: fixed by the sample's seed and the call's position."""
        self.calls += 1
        return (self.seed + self.calls * 7919) % 2**62  # a prime stride: distinct seeds per call


class ExternalRollouts:
    """The SampleSource of external agents and the rollout registry the endpoint serves them from (module doc).

    ``max_total_tokens`` bounds a whole conversation (``policy.max_total_sequence_length``); ``engine_name`` is
    named in errors. All methods run on the event loop that owns the engine and the endpoint.
    """

    def __init__(self, *, max_total_tokens: int, engine_name: str) -> None:
        self.max_total_tokens, self.engine_name = max_total_tokens, engine_name
        self._open: dict[str, ExternalRollout] = {}
        self._waiting: deque[str] = deque()  # opened, not claimed yet, in order
        self._arrived = asyncio.Event()
        self._closed: OrderedDict[str, str] = OrderedDict()  # recently closed id -> why
        self._ids = itertools.count()
        self._run = secrets.token_hex(3)  # ids differ across restarts of the run

    async def sample(self, prompt: Prompt, group_id: str, seed: int) -> Sample:
        """Open a rollout of ``prompt`` for an agent and wait until the agent posts its reward."""
        rollout_id = f"ro-{self._run}-{next(self._ids)}"
        outcome: asyncio.Future[Sample] = asyncio.get_running_loop().create_future()
        rollout = ExternalRollout(rollout_id, prompt, group_id, seed, outcome, Transcript(prompt.token_ids))
        self._open[rollout_id] = rollout
        self._waiting.append(rollout_id)
        self._arrived.set()
        try:
            return await outcome
        finally:
            self._close(rollout)

    async def claim(self, wait_s: float) -> ExternalRollout | None:
        """The oldest unclaimed rollout, waiting up to ``wait_s`` for one; None when none came."""
        try:
            async with asyncio.timeout(wait_s):
                while not self._waiting:
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            return None
        rollout = self._open[self._waiting.popleft()]
        rollout.claimed = True
        return rollout

    def begin_call(self, rollout_id: str, call_prompt: Sequence[int]) -> ExternalRollout:
        """Mark a model call of ``rollout_id`` in flight; RolloutStateError when the call cannot be attributed."""
        rollout = self.claimed(rollout_id)
        if rollout.busy:
            raise RolloutStateError(409, f"rollout {rollout_id}: another call of it is in flight; call one at a time")
        problem = rollout.transcript.mismatch(call_prompt)
        if problem is not None:
            raise RolloutStateError(409, f"rollout {rollout_id}: {problem}")
        if len(call_prompt) >= self.max_total_tokens:
            raise RolloutStateError(
                409,
                f"rollout {rollout_id}: the conversation has {len(call_prompt)} tokens, no room for another turn "
                f"within policy.max_total_sequence_length={self.max_total_tokens}; post its reward",
            )
        rollout.busy = True
        return rollout

    def room(self, call_prompt: Sequence[int]) -> int:
        """How many tokens a call with ``call_prompt`` may generate within the conversation budget."""
        return self.max_total_tokens - len(call_prompt)

    def end_call(
        self,
        rollout: ExternalRollout,
        call_prompt: Sequence[int],
        generation: Generation | None,
        chat: ChatTurn | None = None,
    ) -> None:
        """The call ended: record its ``generation`` (None: it failed) and, for a chat call, its ``chat`` turn;
        RolloutStateError if the rollout closed meanwhile."""
        rollout.busy = False
        if generation is None:
            return
        if rollout.outcome.done():
            raise RolloutStateError(409, f"rollout {rollout.rollout_id} closed during the call ({self._why(rollout)})")
        rollout.transcript.add_call(call_prompt, generation)
        rollout.chat = chat

    def finish(self, rollout_id: str, score: Score) -> ExternalRollout:
        """Post ``score`` for ``rollout_id``: its sample is assembled and its waiting ``sample`` returns it."""
        rollout = self.claimed(rollout_id)
        if rollout.busy:
            raise RolloutStateError(409, f"rollout {rollout_id}: a call of it is still in flight; reward it after")
        if not any(rollout.transcript.trainable):
            failure = RolloutError(
                f"rollout {rollout_id} got a reward before any model call sampled a token (nothing to train on)",
                prompt_id=rollout.prompt.prompt_id,
                group_id=rollout.group_id,
                engine=self.engine_name,
            )
            rollout.outcome.set_exception(failure)
            raise RolloutStateError(409, str(failure))
        rollout.outcome.set_result(Sample(rollout.transcript.generation(), score))
        return rollout

    def claimed(self, rollout_id: str) -> ExternalRollout:
        """The open, claimed rollout ``rollout_id``; RolloutStateError (404 unknown, 409 otherwise) naming it."""
        rollout = self._open.get(rollout_id)
        if rollout is None:
            if rollout_id in self._closed:
                raise RolloutStateError(409, f"rollout {rollout_id} is closed: {self._closed[rollout_id]}")
            raise RolloutStateError(404, f"rollout {rollout_id} is unknown; take one from GET /v1/rollouts/next")
        if not rollout.claimed:
            raise RolloutStateError(409, f"rollout {rollout_id} is not claimed; take it from GET /v1/rollouts/next")
        if rollout.outcome.done():
            raise RolloutStateError(409, f"rollout {rollout_id} is closed: {self._why(rollout)}")
        return rollout

    def _why(self, rollout: ExternalRollout) -> str:
        outcome = rollout.outcome
        if not outcome.done() or outcome.cancelled():
            return "its prompt group ended (a deadline, a failed sibling or the run's end)"
        return "its reward was posted" if outcome.exception() is None else "it failed"

    def _close(self, rollout: ExternalRollout) -> None:
        rollout_id = rollout.rollout_id
        self._open.pop(rollout_id, None)
        if rollout_id in self._waiting:
            self._waiting.remove(rollout_id)
        self._closed[rollout_id] = self._why(rollout)
        while len(self._closed) > RECENTLY_CLOSED:
            self._closed.popitem(last=False)
