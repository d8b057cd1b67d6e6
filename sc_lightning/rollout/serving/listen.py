"""The endpoint's listening socket, bound before anything else starts and handed to the server.

Binding first (not probing) leaves no window for another process to take the port between the check and the start.
The address is 127.0.0.1 unless ``http_host`` says otherwise; off loopback the run needs an API key
(:func:`is_loopback`; preflight refuses to start without one).
"""

from __future__ import annotations

import errno
import ipaddress
import socket

BACKLOG = 128  # connections queued before the server accepts them (they wait while the run starts)
LOOPBACK = "127.0.0.1"


class EndpointPortError(OSError):
    """The endpoint cannot listen on its address and port; the message names the knob, the value and the fix."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def listen_on(host: str, port: int, knobs: str = "") -> socket.socket:
    """A TCP socket listening on ``host``:``port`` (0: a free one); EndpointPortError naming the knob at fault
    (``knobs``: the dotpath prefix of ``http_host`` / ``http_port``) when the port is taken or not allowed, or the
    address is not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port left in TIME_WAIT by a last run is free
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as err:
        sock.close()
        if err.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or isinstance(err, socket.gaierror):
            raise EndpointPortError(
                f"{knobs}http_host: {host!r} is not an address of this machine ({err.strerror}); give one of its "
                f"addresses, {LOOPBACK} or 0.0.0.0"
            ) from None
        if err.errno == errno.EADDRINUSE:
            why = "is already in use by another process"
        elif err.errno == errno.EACCES:
            why = "needs privileges this process lacks"
        else:
            why = f"cannot be listened on ({err.strerror})"
        raise EndpointPortError(
            f"{knobs}http_port: port {port} on {host} {why}; give another port, or 0 for a free one"
        ) from None
    return sock
