"""Ctrl-C on the command line: at any moment of a run, a graceful stop, one ``interrupted`` line and exit code 130.

Python turns SIGINT into a KeyboardInterrupt in the main thread, but a library may swallow it: megatron-core imports
its optional kernels under bare ``except:`` clauses, so a Ctrl-C during start-up could be lost and the run go on.
:class:`InterruptWatch` records each SIGINT as well as raising it, and :meth:`InterruptWatch.check` raises a
swallowed one again at the next step of the start-up or of training. Inside ``Trainer.fit`` Lightning catches the
KeyboardInterrupt, stops gracefully (the callbacks' ``on_exception``, then the strategy's teardown: controller,
engines, Ray, data plane) and exits 1; :func:`lightning_interrupt` turns that exit back into the interrupt, which
the CLI reports with :data:`EXIT_INTERRUPTED`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

EXIT_INTERRUPTED = 130
"""The exit code of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""


class InterruptWatch:
    """Remembers a SIGINT (and raises KeyboardInterrupt as Python's own handler does) so a swallowed one counts."""

    def __init__(self) -> None:
        self.received = False

    def install(self) -> InterruptWatch:
        """Handle SIGINT from now on (in the main thread; elsewhere, leave Python's handler); returns self."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def check(self) -> None:
        """KeyboardInterrupt when a SIGINT came (even one a library swallowed)."""
        if self.received:
            raise KeyboardInterrupt

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        raise KeyboardInterrupt


@contextmanager
def lightning_interrupt(trainer: Any) -> Iterator[None]:
    """Around ``trainer.fit``: Lightning's ``exit(1)`` after its graceful stop on Ctrl-C becomes KeyboardInterrupt."""
    try:
        yield
    except SystemExit:
        if getattr(trainer, "interrupted", False):
            raise KeyboardInterrupt from None
        raise


def clear_unhandled_interrupt_mark() -> None:
    """Undo CPython's mark of an unhandled Ctrl-C once the command has handled it, so it exits with its own code.

    CPython (3.11) marks a KeyboardInterrupt as unhandled whenever one leaves an ``eval`` or ``exec`` of a string,
    even if a caller catches it later, and the interpreter may then end the process by SIGINT at exit instead of
    with its exit code. Importing the libraries evaluates such strings (every ``namedtuple`` and ``dataclass``), so a
    Ctrl-C landing in one turned ``python -m sc_lightning``'s exit code 130 into death by SIGINT (about half the
    time on a loaded box). Each evaluation of a string clears the mark before it runs: a constant one does just
    that.
    """
    eval("None")  # a constant: evaluating it is what clears the mark
