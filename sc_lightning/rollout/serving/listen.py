"""The endpoint's listening socket on 127.0.0.1, bound before anything else starts and handed to the server.

Binding first (not probing) leaves no window for another process to take the port between the check and the start.
"""

from __future__ import annotations

import errno
import socket

BACKLOG = 128  # connections queued before the server accepts them (they wait while the run starts)


class EndpointPortError(OSError):
    """The endpoint cannot listen on its port; the message names the knob, the port and the fix."""


def listen_on_loopback(port: int, knob: str = "http_port") -> socket.socket:
    """A TCP socket listening on 127.0.0.1:``port`` (0: a free one); EndpointPortError naming ``knob`` when the port
    is taken or not allowed."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port left in TIME_WAIT by a last run is free
        sock.bind(("127.0.0.1", port))
        sock.listen(BACKLOG)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            why = "is already in use by another process"
        elif err.errno == errno.EACCES:
            why = "needs privileges this process lacks"
        else:
            why = f"cannot be listened on ({err.strerror})"
        raise EndpointPortError(
            f"{knob}: port {port} on 127.0.0.1 {why}; give another port, or 0 for a free one"
        ) from None
    return sock
