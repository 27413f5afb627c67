"""Which process owns a file: ``PID-START``, its pid and start time in clock ticks, so a reused pid is not taken
for the owner. Staging directories and a serve's pid file record it."""

from __future__ import annotations

import os
from pathlib import Path


def _start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (/proc/PID/stat field 22), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_tag(pid: int | None = None) -> str:
    """``PID-START`` of this process (or ``pid``): what staging names record about their owner."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_ticks(pid) or 0}"


def owner_alive(tag: str) -> bool:
    """Whether the process that ``owner_tag`` described as ``tag`` still runs.

    Arguments:
        tag: ``PID-START``.
    """
    pid, _, start = tag.partition("-")
    try:
        return _start_ticks(int(pid)) == int(start)
    except ValueError:
        return False
