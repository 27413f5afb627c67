"""What a serving process watches every ``WATCH_S``: that tritonserver and its Python-backend stubs live, and
that no engine hangs (``runtime/heartbeat.py``) and no stub stays stopped."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_kit.defaults import DEFAULT_ENGINE_WATCHDOG_S
from trtllm_kit.runtime.heartbeat import silent_for
from trtllm_kit.serve.server.deaths import Deaths
from trtllm_kit.serve.server.process import TritonProcess

# Signals that only come from outside (a user, an OOM killer, a supervisor): a server that died of one was killed;
# one that died otherwise (an abort, a crash, an exit code) after a stub died ended because of the stub.
SENT_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})


@dataclass
class Watch:
    """What a serving process checks every ``WATCH_S``: tritonserver and the stubs it had when it was ready (a
    reload adds the new version's stubs and drops the old one's before unloading it), and that no stub's engine
    holds requests without a step for ``watchdog_s`` (``runtime/heartbeat.py``), and that no stub stays stopped
    (SIGSTOP) that long, idle or not (Triton answers a stopped stub's requests "not healthy" for ever)."""

    process: TritonProcess
    heartbeat_dir: Path | None = None
    watchdog_s: float = DEFAULT_ENGINE_WATCHDOG_S
    stubs: dict[int, str] = field(default_factory=dict)
    stopped_since: dict[int, float] = field(default_factory=dict)  # stub pid → when it was first seen stopped
    deaths: Deaths = field(default_factory=Deaths)  # which stub ended first, when several end between two looks

    def failure(self) -> str | None:
        """Why the server cannot serve any more (a process died or an engine hung), or None; new shm regions are
        made private."""
        self.process.protect_shm()
        self.deaths.follow(self.stubs)
        dead = self._dead_stubs()
        code = None
        if self._server_exited(wait_s=1.0 if dead else 0.0):
            assert self.process.proc is not None
            code = self.process.proc.returncode
            if not dead or -code in SENT_SIGNALS:  # a server that was killed takes its stubs with it
                return f"tritonserver exited with code {code} while serving"
        if dead:  # whatever else ended after it (the server may abort when a stub's shared memory goes)
            pid = self.deaths.in_order(dead)[0]
            name = dead[pid]
            then = "" if code is None else f" (tritonserver exited after it, with code {code})"
            return f"the Python-backend stub of model {name} (pid {pid}) died while serving{then}"
        return self._hung()

    def _dead_stubs(self) -> dict[int, str]:
        """The watched stubs that ended: from their pidfds, or, where one cannot be followed, from the process
        table (a walk of every process's parent, which an idle serve would otherwise pay every look)."""
        if self.deaths.follows(self.stubs):
            return {pid: name for pid, name in self.stubs.items() if self.deaths.has_ended(pid)}
        alive = self.process.stubs()
        return {pid: name for pid, name in self.stubs.items() if pid not in alive}

    def engines_idle(self) -> bool:
        """Whether every engine that beats holds no request (False when none beats: then it cannot be known)."""
        if self.heartbeat_dir is None:
            return False
        beats = [beat for pid in self.stubs if (beat := silent_for(self.heartbeat_dir, pid)) is not None]
        return bool(beats) and all(num_held == 0 for num_held, _ in beats)

    def _server_exited(self, wait_s: float) -> bool:
        proc = self.process.proc
        if proc is None:
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
        return proc.poll() is not None

    def _hung(self) -> str | None:
        """An engine that holds requests without a step, or a stub stopped, for ``watchdog_s``."""
        now = time.monotonic()
        for pid, name in self.stubs.items():
            beat = silent_for(self.heartbeat_dir, pid) if self.heartbeat_dir is not None else None
            if beat is not None and beat[0] > 0 and beat[1] > self.watchdog_s:
                return (f"the engine of model {name} (stub pid {pid}) made no step for {beat[1]:.0f} s while it "
                        f"held {beat[0]} request(s) (watchdog {self.watchdog_s:g} s, --engine-watchdog); it is "
                        "treated as dead")
            if not _is_stopped(pid):
                self.stopped_since.pop(pid, None)
            elif now - self.stopped_since.setdefault(pid, now) > self.watchdog_s:
                return (f"the Python-backend stub of model {name} (pid {pid}) has been stopped for "
                        f"{now - self.stopped_since[pid]:.0f} s (watchdog {self.watchdog_s:g} s, --engine-watchdog); "
                        "it is treated as dead")
        return None


def _is_stopped(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False
