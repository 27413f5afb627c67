"""The private network namespaces ``serve --ray`` and ``serve --dynamo`` run their processes in: made, entered,
their processes found, and ended, by their namespace.

``serve --ray`` starts its driver under ``PRIVATE_NET``. ``serve --dynamo`` holds its namespace in one thread of its
own process (``PrivateNet``: ``unshare(CLONE_NEWNET)`` affects the calling thread alone): Dynamo's processes are
started from that thread and so live in the namespace, and the kit's frontend, listening on the public port outside,
opens its connections to Dynamo's frontend there (``PrivateNet.socket``). ``PrivateNet.join`` enters a running
serve's namespace the same way (by the path of one of its processes' ``ns/net``) to read what listens inside.

Ray binds the machine's first interface whatever it is told; in a network namespace of its own whose only
interface is loopback (``unshare --net``, then ``ip link set lo up``) every Ray process binds 127.0.0.1 and its
ports meet no one else's. Every process Ray starts inherits the namespace, so the namespace names exactly what the
serve started: ending them is by pid, never by process name (``ray stop`` ends every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

PROC_DIR = Path("/proc")
PRIVATE_NET = ("unshare", "--net", "--")  # the command prefix that gives a process a network namespace of its own
LOOPBACK_UP = ("ip", "link", "set", "lo", "up")  # run inside it: 127.0.0.1 answers
CLONE_NEWNET = 0x40000000  # <sched.h>: unshare(2) and setns(2) of the network namespace
T = TypeVar("T")
AddrInfo = tuple[Any, ...]  # (family, type, proto, canonname, sockaddr), as aiohttp's socket_factory is given


def net_namespace(pid: int) -> int | None:
    """The inode of ``pid``'s network namespace; None when the process is gone.

    Arguments:
        pid: a process id.
    """
    try:
        return os.stat(PROC_DIR / str(pid) / "ns" / "net").st_ino
    except OSError:
        return None


def pids_in(namespace: int) -> list[int]:
    """Every process in the network namespace ``namespace`` (an inode of ``net_namespace``).

    Arguments:
        namespace: the namespace's inode.
    """
    found = []
    for entry in PROC_DIR.iterdir():
        if entry.name.isdigit() and net_namespace(int(entry.name)) == namespace:
            found.append(int(entry.name))
    return found


def end_namespace(namespace: int, wait_s: float = 1.0) -> list[int]:
    """SIGKILL every process in ``namespace`` and wait up to ``wait_s`` for them to go; the pids still there.

    Arguments:
        namespace: the namespace's inode (never this process's own: refused); wait_s: seconds to wait.
    """
    assert namespace != net_namespace(os.getpid()), "the serve's own namespace is not private"
    deadline = time.monotonic() + wait_s
    left = pids_in(namespace)
    while left:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
        left = pids_in(namespace)
    return left


def titled_pids(namespace: int, title: str) -> list[int]:
    """The processes of ``namespace`` whose title (first argument) starts with ``title``, e.g. a deployment's
    replicas (``driver.REPLICA_TITLE``).

    Arguments:
        namespace: the namespace's inode; title: the title's start.
    """
    found = []
    for pid in pids_in(namespace):
        try:
            first = (PROC_DIR / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if first.startswith(title):
            found.append(pid)
    return found


def _libc_call(name: str, *args: int) -> None:
    """Call libc's ``name`` (``unshare``, ``setns``); OSError with its errno on failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


class PrivateNet:
    """A network namespace held by one thread of this process: what ``call`` runs, and the processes and sockets
    it makes, are in it; every other thread stays where it was.

    Arguments:
        enter: run once in the thread to put it in its namespace (``private`` or ``join`` give it).
    """

    def __init__(self, enter: Callable[[], None]) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netns")  # one thread, kept for life
        try:
            self._thread.submit(enter).result()
            self.namespace = self.call(lambda: os.stat("/proc/thread-self/ns/net").st_ino)
            # the namespace's file while this process lives: what ``join`` is given from another process
            self.path = PROC_DIR / str(os.getpid()) / "task" / str(self.call(threading.get_native_id)) / "ns" / "net"
        except BaseException:
            self.close()
            raise

    @classmethod
    def private(cls) -> PrivateNet:
        """A new namespace whose only interface is loopback, up (OSError when this process may not make one)."""

        def enter() -> None:
            _libc_call("unshare", CLONE_NEWNET)
            subprocess.run(LOOPBACK_UP, check=True, stdin=subprocess.DEVNULL, capture_output=True)

        return cls(enter)

    @classmethod
    def join(cls, path: Path) -> PrivateNet:
        """The namespace ``path`` names (``/proc/PID/ns/net`` of a process in it).

        Arguments:
            path: the namespace's file.
        """

        def enter() -> None:
            fd = os.open(path, os.O_RDONLY)
            try:
                _libc_call("setns", fd, CLONE_NEWNET)
            finally:
                os.close(fd)

        return cls(enter)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` run in the namespace's thread; its result.

        Arguments:
            fn: what to run; args: its arguments.
        """
        return self._thread.submit(fn, *args).result()

    def socket(self, addr: AddrInfo) -> socket.socket:
        """A socket of the namespace for ``addr`` (aiohttp's ``socket_factory``).

        Arguments:
            addr: family, type and protocol first.
        """
        family, kind, proto = addr[0], addr[1], addr[2]
        return self.call(socket.socket, family, kind, proto)

    def close(self) -> None:
        """Let the thread go: the namespace ends with the last process in it."""
        self._thread.shutdown(wait=False)
