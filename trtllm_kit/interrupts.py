"""Ctrl-C and SIGTERM, delivered only where raising is safe.

A ``KeyboardInterrupt`` raised inside a native extension that calls back into Python (safetensors'
``get_tensor`` does) can be turned into an unrelated error, or crash the process. The CLI installs these
handlers; code around such calls wraps them in ``INTERRUPTS.deferred()``, and a signal that arrives
meanwhile is raised as ``KeyboardInterrupt`` right after the call returns.

A ``KeyboardInterrupt`` raised inside a ``__del__`` method (the ``regex`` module's ``Group.__del__`` runs
whenever transformers drops a compiled pattern) or a weakref finalizer is printed as "Exception ignored"
and lost: the program carries on as if nothing happened. Raised inside the import of torch or of an
extension module, it can reach C++ init code (abort) or ``PyRun_String`` (the interpreter then kills itself
with SIGINT at exit, whatever exit code was asked for). A signal that lands in either is held and delivered
again every 10 ms from a timer (``SIGALRM``) until it lands outside them. Only the first signal is raised; later
ones are recorded and never cut the cleanup that the first one started short. ``raise_if_received`` lets a
commit point (renaming a build into place) refuse to go ahead after any signal at all.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

REDELIVER_S = 0.01
INTERRUPTED = "interrupted; nothing was written."  # an interrupted command's one line, after "Error: "
NATIVE_INIT_PACKAGES = ("torch",)  # their __init__ runs C++ that calls back into Python


def _unsafe(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a caller is a ``__del__`` method, a weakref finalizer or callback (they swallow
    exceptions), or an import (an extension's init code may run Python through ``PyRun_String``, after which an
    exception makes the interpreter kill itself with SIGINT at exit, or through C++ that aborts on it): an
    extension module's, or a package's in ``NATIVE_INIT_PACKAGES`` whose Python init drives such code."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (code.co_name == "__call__" and code.co_filename.endswith("weakref.py")):
            return True
        if code.co_name == "cb" and code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True  # the weakref callback that drops a module lock
        if code.co_name == "_load_unlocked" and code.co_filename.startswith("<frozen importlib._bootstrap"):
            spec = frame.f_locals.get("spec")
            name, origin = getattr(spec, "name", ""), getattr(spec, "origin", None) or ""
            if name.partition(".")[0] in NATIVE_INIT_PACKAGES or origin.endswith(".so"):
                return True
        frame = frame.f_back
    return False


class Interrupts:
    """The process's SIGINT/SIGTERM handling (signals are process-wide, so there is one instance)."""

    def __init__(self) -> None:
        self._depth = 0
        self._pending: int | None = None
        self._received: int | None = None  # the first signal, once it has been raised or is about to be
        self._raised = False

    def install(self) -> None:
        """Handle SIGINT and SIGTERM here (main thread only)."""
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGALRM, self._redeliver)

    @property
    def pending(self) -> int | None:
        """A signal held by a ``deferred`` block or a finalizer, not yet raised."""
        return self._pending

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._received is None:
            self._received = signum
        if self._raised:
            return  # the first signal is already on its way; cleanup must not be cut short
        self._pending = signum
        self._raise_if_safe(frame)

    def _redeliver(self, _signum: int, frame: FrameType | None) -> None:
        if self._pending is not None and not self._raised:
            self._raise_if_safe(frame)

    def _raise_if_safe(self, frame: FrameType | None) -> None:
        if self._depth:
            return  # raised when the outermost deferred block ends
        if _unsafe(frame):
            signal.setitimer(signal.ITIMER_REAL, REDELIVER_S)
            return
        signum, self._pending = self._pending, None
        assert signum is not None, "a signal is pending here"
        self._raised = True
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def raise_if_received(self) -> None:
        """Raise ``KeyboardInterrupt`` if any signal arrived since ``install``, even one whose exception a
        finalizer swallowed: call it before an action that makes a result final."""
        if self._received is not None:
            self._pending = None
            self._raised = True
            raise KeyboardInterrupt(signal.Signals(self._received).name)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold signals until the block ends, then raise the first one as ``KeyboardInterrupt``."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending is not None and not self._raised:
                signum, self._pending = self._pending, None
                self._raised = True
                raise KeyboardInterrupt(signal.Signals(signum).name)


INTERRUPTS = Interrupts()
