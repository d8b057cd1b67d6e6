"""The failure taxonomy of a rollout attempt, and the retry budgets that act on it.

- **infra**: the machinery failed — an engine that is unreachable or dead, a deadline that fired, a lost
  connection, an HTTP 5xx / 408 / 429 — and a retry (after an exponential back-off) may well succeed;
- **data**: the prompt or its scoring failed — an environment that raised or returned garbage, a tokenisation
  error, an HTTP 4xx — and a retry succeeds only if the failure was random; anything not recognised counts as data,
  so unknown errors fail loudly instead of being retried for long.

:func:`classify` walks the exception and its ``__cause__`` chain (cycle-safe, 8 links at most).
:class:`RetryBudget` counts the attempts of one prompt group against
``async_rl.rollout_failure.max_infra_attempts_per_prompt`` / ``max_data_attempts_per_prompt`` and says how long to
back off before the next infra attempt: ``min(backoff_base_s * 2**(n - 1), max_backoff_s)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FailureKind = Literal["infra", "data"]

_INFRA_TYPES: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError)
_INFRA_NAMES = frozenset(
    {
        "EngineError",
        "RolloutTimeout",
        "RayActorError",
        "ActorDiedError",
        "ActorUnavailableError",
        "GetTimeoutError",
        "NodeDiedError",
        "ObjectLostError",
        "OutOfMemoryError",
        "RaySystemError",
        "ClientConnectorError",
        "ClientOSError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
    }
)


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def classify(exc: BaseException) -> FailureKind:
    """``"infra"`` if ``exc`` or a cause of it is an infrastructure failure, else ``"data"``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    for _ in range(8):
        if current is None or id(current) in seen:
            break
        seen.add(id(current))
        status = _http_status(current)
        if status is not None:
            return "infra" if status >= 500 or status in (408, 429) else "data"
        if isinstance(current, _INFRA_TYPES) or any(t.__name__ in _INFRA_NAMES for t in type(current).__mro__):
            return "infra"
        current = current.__cause__
    return "data"


@dataclass
class RetryBudget:
    """One prompt group's attempts so far, by kind, against the configured budgets."""

    max_infra_attempts: int
    max_data_attempts: int
    backoff_base_s: float
    max_backoff_s: float
    infra: int = 0
    data: int = 0

    def record(self, kind: FailureKind) -> bool:
        """Count a failed attempt; True if another attempt is allowed."""
        if kind == "infra":
            self.infra += 1
            return self.infra < self.max_infra_attempts
        self.data += 1
        return self.data < self.max_data_attempts

    def backoff_s(self, kind: FailureKind) -> float:
        """How long to wait before retrying after a failure of ``kind`` (data failures retry at once)."""
        if kind == "data":
            return 0.0
        return min(self.backoff_base_s * 2 ** (self.infra - 1), self.max_backoff_s)

    @property
    def attempts(self) -> int:
        """Failed attempts so far, both kinds."""
        return self.infra + self.data
