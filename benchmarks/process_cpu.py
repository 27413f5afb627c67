"""CPU seconds by process of a running serve, from ``/proc``: what each of its processes (the serve with its OpenAI
frontend, tritonserver, each Python stub) spends on a run of requests, less what it spends idle.

CPU time (user + system, every thread of the process) holds on a loaded machine where wall time does not: a process
that waits for a core is not charged for the wait.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessCpu:
    """One process's CPU per generated token over a run, its idle rate taken out.

    Attributes:
        name: what the process is (``frontend (serve)``, ``tritonserver``, ``stub <model>``, ...).
        pid: its process id.
        ms_per_token: CPU milliseconds per generated token.
        idle_ms_per_s: CPU milliseconds per second it spent idle (the baseline taken out).
    """

    name: str
    pid: int
    ms_per_token: float
    idle_ms_per_s: float


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of every thread of ``pid`` so far (0 when it has ended).

    Arguments:
        pid: a process id.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime (fields 14 and 15 of the line)


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def process_name(pid: int, root: int) -> str:
    """What a process of a serve is, from its command line.

    Arguments:
        pid: a process of the serve; root: the serve's own pid (its OpenAI frontend runs in it).
    """
    if pid == root:
        return "frontend (serve)"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    words = [word.decode(errors="replace") for word in argv if word]
    program = Path(words[0]).name if words else "?"
    if program.startswith("triton_python_backend_stub") and len(words) > 1:  # argv[1]: <repo>/<model>/<v>/model.py
        return f"stub {Path(words[1]).parents[1].name}"
    if program == "tritonserver":
        return "tritonserver"
    module = next((w for w in words[1:] if w.startswith("trtllm_kit.")), None)
    return module.rpartition(".")[2] if module else program


def serve_processes(root: int) -> dict[int, str]:
    """Every process of the serve ``root`` (itself and its descendants), by pid, with ``process_name``.

    Arguments:
        root: the serve's pid.
    """
    parents = {int(entry): _parent(int(entry)) for entry in os.listdir("/proc") if entry.isdigit()}
    found, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid and child not in found]
        found.update(children)
        frontier += children
    return {pid: process_name(pid, root) for pid in sorted(found)}


def by_process(processes: dict[int, str], run: Callable[[], int], idle_s: float) -> list[ProcessCpu]:
    """Each process's CPU per token of ``run`` (which returns the tokens it generated), less its idle rate over the
    ``idle_s`` seconds before.

    Arguments:
        processes: pid → name (``serve_processes``); run: the measured work; idle_s: the idle baseline's length.
    """
    start, wall = {pid: cpu_seconds(pid) for pid in processes}, time.perf_counter()
    time.sleep(idle_s)
    idle = {pid: (cpu_seconds(pid) - start[pid]) / (time.perf_counter() - wall) for pid in processes}
    start, wall = {pid: cpu_seconds(pid) for pid in processes}, time.perf_counter()
    num_tokens = run()
    elapsed = time.perf_counter() - wall
    spent = {pid: cpu_seconds(pid) - start[pid] - idle[pid] * elapsed for pid in processes}
    return [ProcessCpu(name, pid, 1000 * spent[pid] / num_tokens, 1000 * idle[pid])
            for pid, name in processes.items()]
