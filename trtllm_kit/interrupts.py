"""Ctrl-C and SIGTERM, delivered only where raising is safe.

A ``KeyboardInterrupt`` raised inside a native extension that calls back into Python (safetensors'
``get_tensor`` does) can be turned into an unrelated error, or crash the process. The CLI installs these
handlers; code around such calls wraps them in ``INTERRUPTS.deferred()``, and a signal that arrives
meanwhile is raised as ``KeyboardInterrupt`` right after the call returns.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Interrupts:
    """The process's SIGINT/SIGTERM handling (signals are process-wide, so there is one instance)."""

    def __init__(self) -> None:
        self._depth = 0
        self._pending: int | None = None

    def install(self) -> None:
        """Handle SIGINT and SIGTERM here (main thread only)."""
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self._depth:
            self._pending = signum
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold signals until the block ends, then raise the first one as ``KeyboardInterrupt``."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending is not None:
                signum, self._pending = self._pending, None
                raise KeyboardInterrupt(signal.Signals(signum).name)


INTERRUPTS = Interrupts()
