"""The private network namespace ``serve --ray`` runs Ray in: its processes found, and ended, by their namespace.

Ray binds the machine's first interface whatever it is told; in a network namespace of its own whose only
interface is loopback (``unshare --net``, then ``ip link set lo up``) every Ray process binds 127.0.0.1 and its
ports meet no one else's. Every process Ray starts inherits the namespace, so the namespace names exactly what the
serve started: ending them is by pid, never by process name (``ray stop`` ends every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

PROC_DIR = Path("/proc")
PRIVATE_NET = ("unshare", "--net", "--")  # the command prefix that gives a process a network namespace of its own
LOOPBACK_UP = ("ip", "link", "set", "lo", "up")  # run inside it: 127.0.0.1 answers


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
