"""Engine goodput: where the generation fleet's time and tokens went, by the fate of what it generated.

While at least one prompt group is in flight and the engine is not stood down, the engine counts as busy, and the
elapsed time is shared equally among the groups in flight (processor sharing), so the groups' shares add up to the
busy time exactly (one running sum of ``elapsed / groups in flight`` gives every group's share as the difference
of its values at the group's start and end). A group's share and the tokens of its finished completions then
follow its fate:

    trained      selected for a training step
    wasted       evicted by the sampler, aborted by a refit, or failed (a retried attempt, a dropped group)
    pending      in flight or buffered: its fate is not known yet

Stood-down time (a colocated engine during the train step) and idle time (nothing in flight) complete the wall
time since the accountant started: ``trained + wasted + pending + stood_down + idle == wall``. A completion cut
off mid-generation (an abort, a failure) counts its engine time but not its unknown tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import astuple, dataclass


@dataclass(frozen=True)
class EngineTime:
    """A snapshot of the engine fleet's goodput accounts (seconds and completion tokens since the start)."""

    trained_s: float = 0.0
    wasted_s: float = 0.0
    pending_s: float = 0.0
    stood_down_s: float = 0.0
    idle_s: float = 0.0
    trained_tokens: int = 0
    wasted_tokens: int = 0

    @property
    def wall_s(self) -> float:
        """The wall time the accounts cover: the sum of the five time parts."""
        return self.trained_s + self.wasted_s + self.pending_s + self.stood_down_s + self.idle_s

    def __add__(self, other: EngineTime) -> EngineTime:
        """Both accounts together: a resumed run's totals are its bundle's plus those of the process since."""
        return EngineTime(*(mine + theirs for mine, theirs in zip(astuple(self), astuple(other), strict=True)))

    def parts(self) -> dict[str, float]:
        """The time parts by name (``trained``, ``wasted``, ``pending``, ``stood_down``, ``idle``)."""
        return {
            "trained": self.trained_s,
            "wasted": self.wasted_s,
            "pending": self.pending_s,
            "stood_down": self.stood_down_s,
            "idle": self.idle_s,
        }


class EngineGoodput:
    """The accountant: told when groups start and stop generating and what became of them, it keeps
    :class:`EngineTime`. Groups are named by their group id (one per attempt)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()
        self._stood_down = False
        self._share = 0.0  # engine seconds one group in flight has accrued since the start
        self._running: dict[str, float] = {}  # in flight: the running share when the group started
        self._finished: dict[str, tuple[float, int]] = {}  # buffered: (engine seconds, completion tokens)
        self._tokens: dict[str, int] = {}  # completion tokens finished so far, by group in flight
        self._idle_s = self._stood_down_s = self._trained_s = self._wasted_s = 0.0
        self._trained_tokens = self._wasted_tokens = 0

    def started(self, group_id: str) -> None:
        """Group ``group_id`` starts generating."""
        self._advance()
        self._running[group_id] = self._share

    def generated(self, group_id: str, tokens: int) -> None:
        """A completion of ``group_id`` finished with ``tokens`` tokens."""
        self._tokens[group_id] = self._tokens.get(group_id, 0) + tokens

    def committed(self, group_id: str, tokens: int | None = None) -> None:
        """``group_id`` finished and waits in the buffer; ``tokens``: its completions' tokens, when they differ from
        what :meth:`generated` counted (completions reused from an earlier attempt)."""
        seconds, counted = self._stop(group_id)
        self._finished[group_id] = (seconds, counted if tokens is None else tokens)

    def failed(self, group_id: str) -> None:
        """``group_id`` stopped without a group (failed or aborted): its time and finished tokens are waste."""
        seconds, tokens = self._stop(group_id)
        self._wasted_s += seconds
        self._wasted_tokens += tokens

    def wasted_tokens(self, tokens: int) -> None:
        """Completions kept across attempts (token capture) whose prompt was then dropped or aborted."""
        self._wasted_tokens += tokens

    def trained(self, group_ids: Iterable[str]) -> None:
        """These buffered groups were selected for a training step."""
        for group_id in group_ids:
            seconds, tokens = self._finished.pop(group_id, (0.0, 0))
            self._trained_s += seconds
            self._trained_tokens += tokens

    def evicted(self, group_ids: Iterable[str]) -> None:
        """These buffered groups were evicted: never trained."""
        for group_id in group_ids:
            seconds, tokens = self._finished.pop(group_id, (0.0, 0))
            self._wasted_s += seconds
            self._wasted_tokens += tokens

    def stand_down(self) -> None:
        """The engine released its accelerator (colocated): nothing generates until :meth:`wake`."""
        self._advance()
        self._stood_down = True

    def wake(self) -> None:
        """The engine took its accelerator back."""
        self._advance()
        self._stood_down = False

    def snapshot(self) -> EngineTime:
        """The accounts now."""
        self._advance()
        running_s = sum(self._share - started for started in self._running.values())
        buffered_s = sum(seconds for seconds, _ in self._finished.values())
        return EngineTime(
            trained_s=self._trained_s,
            wasted_s=self._wasted_s,
            pending_s=running_s + buffered_s,
            stood_down_s=self._stood_down_s,
            idle_s=self._idle_s,
            trained_tokens=self._trained_tokens,
            wasted_tokens=self._wasted_tokens,
        )

    def _stop(self, group_id: str) -> tuple[float, int]:
        """Stop ``group_id``'s accrual; its engine seconds and finished tokens."""
        self._advance()
        started = self._running.pop(group_id, self._share)
        return self._share - started, self._tokens.pop(group_id, 0)

    def _advance(self) -> None:
        """Share the time since the last event: among the groups in flight, or to stood-down or idle time."""
        now = self._clock()
        elapsed, self._last = now - self._last, now
        if self._stood_down:
            self._stood_down_s += elapsed
        elif self._running:
            self._share += elapsed / len(self._running)
        else:
            self._idle_s += elapsed
