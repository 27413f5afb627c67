"""SIGINT and SIGTERM noted instead of raised while a serve runs its processes in the foreground, so that it stops
them in order and clears its run directory (the ``trtllm-serve`` paths, which run no asyncio loop)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_requests() -> Iterator[threading.Event]:
    """Yield an event set by SIGINT or SIGTERM while the block runs; the earlier handlers come back after it."""
    requested = threading.Event()

    def note(_sig: int, _frame: object) -> None:
        requested.set()

    saved = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        yield requested
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
