"""When each of a set of processes ended, in the order they ended: a thread waits on their pidfds.

A watch that looks every half second cannot tell which of several dead processes went first: when a stub is
killed, tritonserver may abort and its other stubs end within the same half second. A process need not be a child
of ours for its pidfd to become readable the moment it ends.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterable

POLL_MS = 200  # how soon a newly followed process is waited on


class Deaths:
    """The moment each followed process was seen to end (``time.monotonic``); one already gone when first followed
    ended then, and on a system without pidfds none is seen to end."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pid -> pidfd, while it lives
        self._ended: dict[int, float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def follow(self, pids: Iterable[int]) -> None:
        """Wait on every pid not yet followed."""
        with self._lock:
            for pid in pids:
                if pid in self._fds or pid in self._ended:
                    continue
                try:
                    self._fds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:  # gone already: before any process followed here ends
                    self._ended[pid] = time.monotonic()
                except (AttributeError, OSError):  # a system without pidfds
                    continue
            if self._fds and self._thread is None:
                self._thread = threading.Thread(target=self._wait, name="stub-deaths", daemon=True)
                self._thread.start()

    def has_ended(self, pid: int) -> bool:
        with self._lock:
            return pid in self._ended

    def follows(self, pids: Iterable[int]) -> bool:
        """Whether the end of every one of ``pids`` is seen here: each is waited on, or has ended (False where a pid
        could not be followed: a system without pidfds)."""
        with self._lock:
            return all(pid in self._fds or pid in self._ended for pid in pids)

    def in_order(self, pids: Iterable[int]) -> list[int]:
        """``pids`` by the moment each ended, first first; those not seen to end keep their order, last."""
        pids = list(pids)
        with self._lock:
            ended = dict(self._ended)
        return sorted(pids, key=lambda pid: (pid not in ended, ended.get(pid, 0.0), pids.index(pid)))

    def _wait(self) -> None:
        while True:
            with self._lock:
                fds = {fd: pid for pid, fd in self._fds.items()}
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            ready = poller.poll(POLL_MS)
            now = time.monotonic()
            with self._lock:
                for fd, _ in ready:
                    pid = fds[fd]
                    self._ended.setdefault(pid, now)
                    os.close(self._fds.pop(pid))
                if not self._fds:
                    self._thread = None
                    return
