"""A TCP port to hand a process the tests start (a Ray head, an endpoint pinned by a flag)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nothing on this machine listens on right now (another process may take it before it is used)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
