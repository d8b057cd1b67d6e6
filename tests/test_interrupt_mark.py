"""CPython's mark of an unhandled Ctrl-C (sc_lightning/interrupt.py): set by a KeyboardInterrupt that leaves an
``eval`` of a string even when a caller catches it, and cleared by ``clear_unhandled_interrupt_mark``, which the
command line calls once it has handled a Ctrl-C so the process exits 130 rather than by SIGINT
(tests/test_interrupt.py runs the real command)."""

from __future__ import annotations

import contextlib
import ctypes

from sc_lightning.interrupt import clear_unhandled_interrupt_mark


def test_a_ctrl_c_caught_after_it_left_an_eval_is_marked_unhandled_until_cleared() -> None:
    mark = ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt")  # CPython 3.11's flag
    try:
        with contextlib.suppress(KeyboardInterrupt):  # as when a Ctrl-C lands in a namedtuple's eval
            eval("(_ for _ in ()).throw(KeyboardInterrupt)")
        assert mark.value == 1  # caught, and still marked: at exit the interpreter would kill itself by SIGINT
    finally:
        clear_unhandled_interrupt_mark()
    assert mark.value == 0
