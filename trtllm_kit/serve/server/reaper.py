"""A small watcher process that removes a server's processes and shared memory when ``serve`` dies.

``serve`` starts it first, in a session of its own, holding the write end of a pipe whose read end is the
reaper's stdin, and writes the process-group id of every server it starts to it. Whatever ends ``serve``
(SIGKILL included), the kernel closes that pipe: the reaper reads end-of-file, SIGKILLs each group it was given
(tritonserver and every Python-backend stub it forked) and deletes the ``/dev/shm`` regions of the launch's
prefix and the directories its servers made that match the globs it was given (a disaggregated serve's KV socket
directories). A graceful stop does all of this itself first, so the reaper then finds nothing left.

A group's id is its leader's pid, which the kernel hands out again once the group is gone: on a machine that starts
tens of thousands of processes (``pid_max`` 32768), a group that ended long before the reaper reaps (the first start
of a server that aborted while starting) may by then name another program's group. So the reaper notes each leader's
start time when told of it, and leaves alone a group whose pid now names a process that started at another time.

Run as ``python -m trtllm_kit.serve.server.reaper SHM_PREFIX [DIR_GLOB ...]``; it imports nothing of the kit, so it
starts at once.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PROC_DIR = Path("/proc")


def reap(groups: Mapping[int, int | None], shm_prefix: str, wait_s: float = 2.0,
         dir_globs: tuple[str, ...] = ()) -> None:
    """SIGKILL every process of ``groups``, wait until they are gone (``wait_s`` at most), remove the shm regions
    and this user's directories that match ``dir_globs``. A group whose leader's pid names a process started at
    another time than the leader was is gone already (the kernel reuses no pid a group still holds): it is left
    alone. A group whose leader is gone may still hold its children: it is ended.

    Arguments:
        groups: process groups to end, each with its leader's start time (``start_time``; None: not known);
        shm_prefix: the launch's ``/dev/shm`` region prefix (empty: none); wait_s: how long to wait for them;
        dir_globs: patterns of directories the servers made.
    """
    pgids = [pgid for pgid, started in groups.items() if started is None or start_time(pgid) in (started, None)]
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(group_alive(pgid) for pgid in pgids):
        time.sleep(0.02)
    if shm_prefix:
        for region in SHM_DIR.glob(f"{shm_prefix}*"):
            region.unlink(missing_ok=True)
    for pattern in dir_globs:
        for path in glob.glob(pattern):
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path) and os.lstat(path).st_uid == os.geteuid():
                    shutil.rmtree(path, ignore_errors=True)


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still runs. A zombie counts as gone: it has exited and holds no memory,
    file or port, only an entry its parent has not collected yet (stubs whose server is gone are collected by
    init, which may take seconds)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not PROC_DIR.is_dir():  # no /proc to tell zombies apart
        return True
    return any(_runs_in_group(stat, pgid) for stat in PROC_DIR.glob("[0-9]*/stat"))


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``); None when there is no such
    process (or no ``/proc``).

    Arguments:
        pid: a process id.
    """
    try:
        text = (PROC_DIR / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2:].split(" ")[19])  # field 22, after "PID (COMMAND) "


def _runs_in_group(stat: Path, pgid: int) -> bool:
    """Whether ``/proc/PID/stat`` is of a process of group ``pgid`` that is not a zombie (False once it is gone)."""
    try:
        text = stat.read_text()
    except OSError:
        return False
    state, _ppid, group = text[text.rindex(")") + 2:].split(" ", 3)[:3]  # after "PID (COMMAND) "
    return int(group) == pgid and state != "Z"


def main(argv: list[str]) -> int:
    """Read process-group ids from stdin until end-of-file, then reap them.

    Arguments:
        argv: ``[SHM_PREFIX, DIR_GLOB ...]``.
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe's end ends the reaper
    shm_prefix = argv[0] if argv else ""
    groups: dict[int, int | None] = {}
    for line in sys.stdin:
        if line.strip().isdigit():
            groups[int(line)] = start_time(int(line))  # the leader was just started: this is its start
    reap(groups, shm_prefix, dir_globs=tuple(argv[1:]))
    return 0


class Reaper:
    """The reaper of one ``serve``: start it, tell it each server's process group; closing it (or dying) reaps.

    Arguments:
        shm_prefix: the launch's shared-memory prefix; dir_globs: patterns of directories its servers make.
    """

    def __init__(self, shm_prefix: str, dir_globs: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "trtllm_kit.serve.server.reaper", shm_prefix,
                                      *dir_globs],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})

    def watch(self, pgid: int) -> None:
        """Reap process group ``pgid`` when ``serve`` ends."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{pgid}\n".encode())
        self.proc.stdin.flush()

    def close(self, timeout_s: float = 5.0) -> None:
        """End the reaper (it reaps what is left of the groups it was given)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
