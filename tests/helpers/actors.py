"""Killing a Ray actor in a test and knowing it is dead before the next step."""

from __future__ import annotations

import time
from typing import Any


def kill_and_wait(actor: Any, timeout_s: float = 60.0) -> None:
    """``ray.kill`` ``actor`` (no restart) and return once Ray answers its calls with its death.

    ``ray.kill`` only asks the cluster: under load a call made right after it may still be served, so a test that
    kills an actor to see its death handled would otherwise race the kill. Raises ``AssertionError`` if the actor still
    answers after ``timeout_s``.
    """
    import ray

    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            continue
    raise AssertionError(f"the killed actor still answered after {timeout_s:.0f} s")
