"""The private Ray head's start: when Ray's fixed 30 s wait for its raylet runs out (a loaded machine), the processes
the failed start left are ended and the head starts once more; any other failure is not retried.

Run in a process of its own: ``end_children`` ends every process the caller started.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, subprocess, sys
import psutil
from trtllm_kit.serve.ray.head_start import start_head

failures = sys.argv[1].split(",")  # what each try raises ("" = starts)
left, calls = [], []

def init():
    calls.append("init")
    left.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)
    message = failures[calls.count("init") - 1]
    if message:
        raise Exception(message)

try:
    start_head(init, lambda: calls.append("shutdown"))
    outcome = "started"
except Exception as exc:
    outcome = str(exc)
gone = {pid: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in left}
for child in psutil.Process().children():
    child.kill()
print(json.dumps({"outcome": outcome, "calls": calls, "gone": [gone[pid] for pid in left]}))
"""
TIMEOUT = "The current node timed out during startup. This could happen because some of the raylet failed"


def _start(*failures: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(failures)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_timed_out_start_ends_what_it_left_and_starts_once_more() -> None:
    result = _start(TIMEOUT, "")
    assert result["outcome"] == "started"
    assert result["calls"] == ["init", "shutdown", "init"]
    assert result["gone"] == [True, False]  # the failed start's process ended before the second try, not its own


def test_a_second_timeout_is_raised() -> None:
    result = _start(TIMEOUT, TIMEOUT)
    assert result["outcome"] == TIMEOUT and result["calls"] == ["init", "shutdown", "init"]


def test_another_failure_is_not_retried() -> None:
    result = _start("Ray could not bind its port", "")
    assert result["outcome"] == "Ray could not bind its port" and result["calls"] == ["init"]
    assert result["gone"] == [False]
