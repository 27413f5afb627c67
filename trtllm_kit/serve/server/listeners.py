"""Whose listener answers on a TCP port (Linux ``/proc``): a server counts as ready only when the port it answered
on is held by the server's own processes.

A port seen free can be taken by another program before the server binds it. Another Triton that took it answers
``/v2/health/ready`` with 200 as well, and the server being waited for then fails its bind and exits a moment later.
So the readiness probe alone cannot tell the two apart. The kernel's table of listening sockets
(``/proc/net/tcp``, ``/proc/net/tcp6``: the port, the state, the socket's inode) and the descriptors of the
server's processes (``/proc/PID/fd``: ``socket:[INODE]``) can.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_DIR = Path("/proc")
TCP_TABLES = ("net/tcp", "net/tcp6")
LISTEN = "0A"  # the state column of a listening socket


def listening_inodes(port: int) -> set[int]:
    """The inodes of the sockets listening on TCP ``port`` at any address, as this process's network namespace
    sees them (empty: none listed, or no ``/proc``).

    Arguments:
        port: a TCP port.
    """
    inodes = set()
    for table in TCP_TABLES:
        try:
            lines = (PROC_DIR / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            columns = line.split()  # sl, local address, remote address, state, ..., inode (the tenth)
            if len(columns) > 9 and columns[3] == LISTEN and int(columns[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(columns[9]))
    return inodes


def descendants(leader: int) -> set[int]:
    """``leader`` and every process below it (its children, theirs, ...), from ``/proc/PID/stat``.

    Arguments:
        leader: a process id.
    """
    children: dict[int, list[int]] = {}
    for stat in PROC_DIR.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parent = int(text[text.rindex(")") + 2:].split(" ", 2)[1])  # after "PID (COMMAND) STATE "
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = {leader}, [leader]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open (empty when it is gone or not this user's)."""
    try:
        names = os.listdir(PROC_DIR / str(pid) / "fd")
    except OSError:
        return set()
    inodes = set()
    for name in names:
        try:
            target = os.readlink(PROC_DIR / str(pid) / "fd" / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def held_by(leader: int, port: int) -> bool | None:
    """Whether the listener on ``port`` is held by ``leader`` or a process below it: True, False (another program's),
    or None when ``/proc`` lists no listener there (another network namespace, or no ``/proc``), which says nothing.

    Arguments:
        leader: the server's process (the leader of its group); port: the port its probe was answered on.
    """
    listening = listening_inodes(port)
    if not listening:
        return None
    return any(socket_inodes(pid) & listening for pid in descendants(leader))
