"""The order processes ended in, as ``Deaths`` sees it: the serve's watch names the stub that died first even when
tritonserver and its other stubs end within the same look."""

from __future__ import annotations

import subprocess
import sys
import time

from trtllm_kit.serve.server.deaths import Deaths

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def _ended(deaths: Deaths, pid: int) -> None:
    deadline = time.monotonic() + 60  # a bound, not a measurement
    while not deaths.has_ended(pid):
        assert time.monotonic() < deadline, f"pid {pid} was not seen to end"
        time.sleep(0.01)


def test_processes_are_named_in_the_order_they_ended_not_the_order_they_were_followed() -> None:
    procs = [subprocess.Popen(SLEEPER) for _ in range(3)]
    try:
        deaths = Deaths()
        deaths.follow(proc.pid for proc in procs)
        assert deaths.in_order(proc.pid for proc in procs) == [proc.pid for proc in procs]  # none ended yet
        for index in (1, 2, 0):
            procs[index].kill()
            procs[index].wait()
            _ended(deaths, procs[index].pid)
        assert deaths.in_order(proc.pid for proc in procs) == [procs[1].pid, procs[2].pid, procs[0].pid]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_process_gone_before_it_was_followed_ended_before_those_seen_ending_later() -> None:
    gone, alive = subprocess.Popen(SLEEPER), subprocess.Popen(SLEEPER)
    try:
        gone.kill()
        gone.wait()
        deaths = Deaths()
        deaths.follow([alive.pid, gone.pid])
        assert deaths.has_ended(gone.pid) and not deaths.has_ended(alive.pid)
        alive.kill()
        alive.wait()
        _ended(deaths, alive.pid)
        assert deaths.in_order([alive.pid, gone.pid]) == [gone.pid, alive.pid]
    finally:
        for proc in (gone, alive):
            proc.kill()
            proc.wait()
