"""The engine's liveness signal: a stub that holds requests beats a file; serve's watch reads how old it is.

``serve`` gives tritonserver (and so every Python-backend stub) ``TRTLLM_KIT_HEARTBEAT_DIR``, a directory in
its run directory. The ``tensorrt_llm`` stub's engine loop calls ``Heartbeat.beat`` after every turn: it
rewrites ``<dir>/<stub pid>`` with the number of requests it holds, at most every ``BEAT_EVERY_S`` while that
number stays the same. A stopped or wedged stub cannot rewrite it, so a file that says "holding requests" and is
older than the watchdog period names a hung engine. An idle stub (holding nothing) may stay silent forever.
The writer imports only the standard library: it runs inside the stub.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HEARTBEAT_ENV = "TRTLLM_KIT_HEARTBEAT_DIR"
BEAT_EVERY_S = 0.25


class Heartbeat:
    """The writing side, in a stub: silent when serve gave no directory."""

    def __init__(self) -> None:
        directory = os.environ.get(HEARTBEAT_ENV)
        self.path = Path(directory) / str(os.getpid()) if directory else None
        self.num_held = -1
        self.last_s = 0.0

    def beat(self, num_held: int) -> None:
        """Record that the engine loop turned while it holds ``num_held`` requests.

        Arguments:
            num_held: requests admitted or queued and not yet answered.
        """
        now = time.monotonic()
        if self.path is None or (num_held == self.num_held and now - self.last_s < BEAT_EVERY_S):
            return
        staged = self.path.with_suffix(".tmp")
        staged.write_text(f"{num_held}\n")
        staged.replace(self.path)
        self.num_held, self.last_s = num_held, now


def silent_for(directory: Path, pid: int) -> tuple[int, float] | None:
    """``(requests held, seconds since the last beat)`` of stub ``pid``, or None when it never beat.

    Arguments:
        directory: the heartbeat directory; pid: a stub's process id.
    """
    path = directory / str(pid)
    try:
        num_held = int(path.read_text())
        age_s = time.time() - path.stat().st_mtime
    except (OSError, ValueError):
        return None
    return num_held, age_s
