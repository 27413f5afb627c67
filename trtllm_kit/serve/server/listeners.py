"""Who listens on a TCP port, as psutil reads it (the kernel's table of listening sockets, each matched to the
process whose descriptor holds it): the process a busy port's refusal names (``port_holder``), and whether the port a
readiness probe was answered on is held by the server being waited for (``held_by``).

A port seen free can be taken by another program before the server binds it. Another Triton that took it answers
``/v2/health/ready`` with 200 as well, and the server being waited for then fails its bind and exits a moment later,
so the readiness probe alone cannot tell the two apart; who holds the listener can.
"""

from __future__ import annotations

from typing import Any

import psutil


def listeners(port: int) -> list[Any]:
    """psutil's listening sockets on TCP ``port`` at any address, as this process's network namespace sees them
    (``pid`` None where the holder is not this user's); empty when there is none, or psutil cannot see them.

    Arguments:
        port: a TCP port.
    """
    try:
        return [conn for conn in psutil.net_connections(kind="inet")
                if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return []


def port_holder(port: int) -> str | None:
    """``pid N (name)`` of the process listening on ``port``, or None when it cannot be seen.

    Arguments:
        port: a TCP port.
    """
    for conn in listeners(port):
        if conn.pid:
            try:
                return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
            except psutil.Error:
                return f"pid {conn.pid}"
    return None


def held_by(leader: int, port: int) -> bool | None:
    """Whether the listener on ``port`` is held by ``leader`` or a process below it: True, False (another program's,
    or ``leader`` is gone), or None when no listener is seen there (another network namespace), which says nothing.

    Arguments:
        leader: the server's process (the leader of its group); port: the port its probe was answered on.
    """
    found = listeners(port)
    if not found:
        return None
    try:
        group = {leader, *(child.pid for child in psutil.Process(leader).children(recursive=True))}
    except psutil.Error:
        return False
    return any(conn.pid in group for conn in found)
