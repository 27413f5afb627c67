"""A server process in a session of its own: start with its output in a log file, wait until it is ready while
watching that it is alive, and stop its whole process group (SIGTERM, a grace period, then SIGKILL).

tritonserver (``process.py``), ``trtllm-serve`` (``trtllm_serve.py``) and a server under ``nsys profile``
(``profile/nsys.py``) all run through it. The child leads its own session, so its pid is its process group's id and
one signal reaches everything it started (mpirun's ranks, Python-backend stubs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.names import API_KEY_ENV
from trtllm_kit.serve.server.listeners import held_by
from trtllm_kit.serve.server.state import pycache_dir


@dataclass(frozen=True)
class NotReady:
    """Why a wait for readiness ended without it: the server exited (``exit_code``), the caller's watch found a
    ``problem``, or neither (the deadline passed)."""

    exit_code: int | None = None
    problem: str | None = None


class ProcessGroup:
    """One started server: its process (the leader of its group) and the log file its output goes to.

    Arguments:
        log_path: the log file (appended to: a restart's lines follow the first start's).
    """

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, argv: list[str], env: dict[str, str] | None = None,
              prepare: Callable[[], None] | None = None, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a new session, stdin closed, stdout and stderr appended to the log.

        Arguments:
            argv: the command; env: its whole environment (this process's when None);
            prepare: run in the child before exec; pass_fds: descriptors the child keeps (a listening socket).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=prepare,
                                         pass_fds=pass_fds)
        return self.proc

    def wait_ready(self, is_ready: Callable[[], bool], timeout_s: float, *, poll_s: float, ports: tuple[int, ...] = (),
                   problem: Callable[[], str | None] = lambda: None,
                   stop_requested: Callable[[], bool] = lambda: False) -> NotReady | None:
        """Poll until ``is_ready()`` while the server runs and holds ``ports`` (None), or the server exits,
        ``problem()`` names one, or ``timeout_s`` passes (a ``NotReady`` saying which). A stop requested meanwhile
        ends the wait too (None).

        Arguments:
            is_ready: whether the server answers; timeout_s: seconds from now; poll_s: seconds between polls;
            ports: the ports ``is_ready`` asks on: an answer counts only when their listeners are the server's own
            (``listeners.held_by``), not another program's that took a port after it was checked;
            problem: a failure the caller sees while the server still runs (e.g. in its log), or None;
            stop_requested: whether to give up waiting without an error.
        """
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while not stop_requested():
            code = self.proc.poll()
            if code is not None:
                return NotReady(exit_code=code)
            if is_ready() and all(held_by(self.proc.pid, port) is not False for port in ports):
                return None
            found = problem()
            if found is not None:
                return NotReady(problem=found)
            if time.monotonic() > deadline:
                return NotReady()
            time.sleep(poll_s)
        return None

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the group, wait up to ``grace_s`` for the leader, then SIGKILL the group; the exit code.

        Arguments:
            grace_s: seconds the server gets to end by itself.
        """
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            self.wait_or_kill(grace_s)
        return self.proc.returncode

    def signal(self, sig: int, *, leader_only: bool = False) -> None:
        """Send ``sig`` to the group, or to its leader only (mpirun forwards a SIGTERM to its ranks itself).

        Arguments:
            sig: the signal; leader_only: the leader, not the group.
        """
        assert self.proc is not None, "start() first"
        try:
            if leader_only:
                os.kill(self.proc.pid, sig)
            else:
                os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait_or_kill(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the leader to exit; SIGKILL the group when it has not. The exit code.

        Arguments:
            timeout_s: seconds to wait.
        """
        assert self.proc is not None, "start() first"
        try:
            return self.proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.proc.wait()

    def log_tail(self, num_lines: int = 20) -> str:
        """The last ``num_lines`` lines of the log (read from its last 64 kB)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-num_lines:])

    def log_size(self) -> int:
        """The log's size in bytes now (0 before it exists)."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> bytes:
        """The log from byte ``offset`` on."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read()
        except OSError:
            return b""


def kit_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a server the kit starts: this interpreter's bin directory first on ``PATH`` (the
    Python-backend stub runs the first ``python3`` there, which must be the one that has the kit and numpy,
    whatever ``PATH`` said), and bytecode written under the kit's cache (``pycache_dir``), never beside a source:
    its Python processes (Dynamo's and Ray's, workers, ranks) import sources of a hashed artifact, and each start
    after the first reads what the first compiled instead of compiling torch and the rest again, as it would where
    the environment says ``PYTHONDONTWRITEBYTECODE``. (The Triton stubs' embedded interpreters read neither
    variable: they are given a copy of the repository, ``state.py``.)

    Arguments:
        base: the environment to extend (``os.environ`` when omitted).
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in (API_KEY_ENV, "PYTHONDONTWRITEBYTECODE")}  # no secret
    first = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([first, *(p for p in env.get("PATH", "").split(os.pathsep) if p and p != first)])
    env["PYTHONPYCACHEPREFIX"] = str(pycache_dir())
    return env
