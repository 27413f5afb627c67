"""Where the test suite's CPU goes, by kind of process: the pytest workers (the tests themselves, in-process builds
and engines, oracles), each serve (its OpenAI frontend), tritonserver, each Python stub by model, Dynamo's and
Ray's processes, the builds and other commands tests run.

    python benchmarks/suite_cpu.py [--json] [PYTEST ARGUMENTS]

Runs pytest with the arguments given (the README's command when none are: ``-q -n 2 --dist loadfile
--no-loadscope-reorder``) and reads the CPU time (user + system) of every process that starts while it runs from
``/proc`` every 0.2 s; each counts with its last reading. A process that lives less than 0.2 s can be missed, and
each loses at most its last 0.2 s: the figures are a floor. Processes that ran before (kernel threads, the shell)
are left out, but not others that start meanwhile: run it on an otherwise idle machine. Prints the kinds by CPU
seconds, with how many processes of each ran, the run's wall time and pytest's exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from process_cpu import cpu_seconds

README_ARGS = ["-q", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
PERIOD_S = 0.2
BEFORE = "-"  # the kind of a process that ran before the run began: not counted


def process_kind(argv: list[str]) -> str:
    """What a process of a test run is, from its command line (``?`` when it is none of the run's).

    Arguments:
        argv: the process's command line.
    """
    line = " ".join(argv)
    program = Path(argv[0]).name if argv else ""
    if program.startswith("triton_python_backend_stub") and len(argv) > 1:  # argv[1]: <repo>/<model>/<v>/model.py
        return f"stub {Path(argv[1]).parents[1].name}"
    if program == "tritonserver":
        return "tritonserver"
    if "exec(eval(sys.stdin.readline()))" in line:  # how pytest-xdist's execnet starts a worker
        return "pytest worker"
    if "-m pytest" in line:
        return "pytest"
    if program in ("raylet", "gcs_server") or "/ray/" in line:
        return "ray"
    if "-m dynamo." in line:
        return "dynamo " + line.split("-m dynamo.", 1)[1].split()[0]
    if "-m trtllm_kit " in line + " ":
        return "trtllm-kit " + (line.split("-m trtllm_kit", 1)[1].split() or ["?"])[0]
    module = next((word for word in argv[1:] if word.startswith("trtllm_kit.")), None)
    if module is not None:
        return module.removeprefix("trtllm_kit.")
    return "python" if program.startswith("python") else "?"


def _argv(pid: int) -> list[str]:
    try:
        return [w.decode(errors="replace") for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
    except OSError:
        return []


def _started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks after boot): with the pid, a process's identity across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def watch(done: threading.Event) -> dict[tuple[int, str], list[Any]]:
    """(pid, start) → [kind, last CPU seconds seen] of every process until ``done`` is set (``BEFORE`` for those
    running when it began). A process is named again until it is one of the run's (a shell that execs a stub
    becomes the stub)."""
    seen: dict[tuple[int, str], list[Any]] = {}
    me = os.getpid()
    first_pass = True
    while not done.is_set():
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            pid = int(entry)
            started, spent = _started(pid), cpu_seconds(pid)
            if started is None:
                continue
            found = seen.get((pid, started))
            if found is None:  # one running before the run is none of its own
                seen[(pid, started)] = [BEFORE if first_pass else process_kind(_argv(pid)), spent]
                continue
            found[1] = max(spent, found[1])
            if found[0] in ("?", "python"):
                found[0] = process_kind(_argv(pid)) or found[0]
        first_pass = False
        time.sleep(PERIOD_S)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: python benchmarks/suite_cpu.py -q tests/serve")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args, pytest_args = parser.parse_known_args()
    done = threading.Event()
    result: dict[str, dict[tuple[int, str], list[Any]]] = {}
    watcher = threading.Thread(target=lambda: result.update(seen=watch(done)), daemon=True)
    watcher.start()
    start = time.perf_counter()
    code = subprocess.call([sys.executable, "-m", "pytest", *(pytest_args or README_ARGS)],
                           stdout=sys.stderr if args.json else None)
    wall_s = time.perf_counter() - start
    done.set()
    watcher.join()
    seconds: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for kind, spent in result["seen"].values():
        if kind not in ("?", BEFORE) and spent > 0:
            seconds[kind] += spent
            counts[kind] += 1
    rows = [{"kind": kind, "cpu_s": round(spent, 1), "processes": counts[kind]}
            for kind, spent in seconds.most_common()]
    if args.json:
        print(json.dumps({"wall_s": round(wall_s, 1), "exit_code": code, "cpu_s": round(sum(seconds.values()), 1),
                          "by_kind": rows}, indent=2))
        return
    print(f"pytest exited {code} after {wall_s:.0f} s; {sum(seconds.values()):.0f} CPU s in its processes:")
    for row in rows:
        print(f"  {row['cpu_s']:8.1f} s  {row['processes']:4d} x  {row['kind']}")
    print(f"reproduce: python benchmarks/suite_cpu.py {' '.join(pytest_args or README_ARGS)}")


if __name__ == "__main__":
    main()
