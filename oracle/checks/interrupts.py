"""Ctrl-C at a safe point: while native code runs (the DSL compiler), SIGINT is deferred.

A ``KeyboardInterrupt`` raised by Python's SIGINT handler inside a callback that native code
made (the CuTe DSL compiler calls back into Python through nanobind) cannot unwind the C++ frames
around it: the process prints ``terminate called after throwing an instance of
'nanobind::python_error'`` and aborts. Inside :func:`deferred_sigint` the handler only records
the request; the loop calls :meth:`Deferred.check` between two compiles, where raising is safe,
and leaving the block raises a request no check saw. Off the main thread it changes nothing
(signals are delivered to the main thread only).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["Deferred", "deferred_sigint"]


class Deferred:
    """A SIGINT received inside :func:`deferred_sigint`, waiting for a safe point."""

    def __init__(self) -> None:
        self.requested = False

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` here if Ctrl-C was pressed since the block began."""
        if self.requested:
            raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_sigint() -> Iterator[Deferred]:
    state = Deferred()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def record(signum, frame) -> None:
        state.requested = True

    previous = signal.signal(signal.SIGINT, record)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)
    state.check()
