"""A running ``tritonserver`` (or ``mpirun`` with its ranks): start, readiness, graceful stop, no leftovers."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from trtllm_kit.errors import KitError
from trtllm_kit.http_probe import answers
from trtllm_kit.serve.server.group import ProcessGroup, kit_environment
from trtllm_kit.serve.server.hidden_args import HiddenArgs, trace_me
from trtllm_kit.serve.server.launcher import LaunchConfig, check_ports_free, launch_argv
from trtllm_kit.serve.server.locate import TritonInstall
from trtllm_kit.serve.server.reaper import SHM_DIR, group_alive

# Triton's error lines: E<MMDD> <time> <thread> <file:line>] <message>
ERROR_LINE = re.compile(r"^E\d{4} [\d:.]+ +\d+ [^\]]*\] (.+)$", re.MULTILINE)
# Error lines every start on a machine without a GPU logs; they are never the cause of a failure.
CPU_NOISE = ("CudaDriverHelper has not been initialized", "CUDA driver version is insufficient")
STUB_FAILURES = ("error while loading shared libraries", "Failed to initialize Python stub")
# How an abort at start-up shows: SIGABRT, or boost's lock error on the Python backend's shared memory (seen under
# heavy load). A second start usually succeeds.
ABORT_MARKERS = (b"boost::interprocess::lock_exception", b"terminate called after throwing")
PR_SET_PDEATHSIG = 1
# tritonserver logs this on SIGTERM once no inference is in flight; it then unloads every model (a Python stub takes
# 1-2 s to end, and Triton polls them once a second, up to its exit timeout). A decoupled model's requests are still
# answered then, so the group is killed early only when the engines say they hold nothing, UNLOAD_GRACE_S apart.
DRAINED_LINE = b"All models are stopped, unloading models"
UNLOAD_GRACE_S = 0.25
STUB_NAME = "triton_python_backend_stub"
LOG = logging.getLogger(__name__)


def _private() -> None:
    """In the child before exec: files and shared-memory regions it creates are its user's alone."""
    os.umask(0o077)


def die_with_parent_thread() -> None:
    """In the child before exec: end (SIGTERM) when the launching process dies, so nothing is orphaned; private
    files."""
    _private()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _traced(prepare: Callable[[], None]) -> Callable[[], None]:
    """``prepare``, then stop at the exec for ``HiddenArgs.reveal``."""
    def both() -> None:
        prepare()
        trace_me()
    return both


class StartupAbort(KitError):
    """tritonserver aborted while starting (not a configuration error: starting it again may succeed)."""


class TritonProcess:
    """One launch of the server: owns the process group, its log file and its shared-memory regions."""

    def __init__(self, install: TritonInstall, config: LaunchConfig, log_path: Path, *,
                 argv: list[str] | None = None, mpirun: str = "mpirun", env: dict[str, str] | None = None) -> None:
        self.install = install
        self.env = env or {}  # added to the server's environment
        self.config = config
        self.argv = argv if argv is not None else launch_argv(install, config, mpirun=mpirun)
        self.group = ProcessGroup(log_path)
        self.log_from = 0  # where this start's lines begin in the log (a restart appends to it)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.group.proc

    @property
    def pid(self) -> int | None:
        return self.group.pid

    def start(self, *, die_with_parent: bool = True) -> None:
        """Check the ports, then start the server in its own session with its output in ``log_path``.

        Arguments:
            die_with_parent: end the server when this process dies (off for a detached server's launcher).
        """
        check_ports_free(self.config.endpoints.host, self.config.endpoints.ports())
        # a region of this prefix left by a killed launch holds a mutex whose owner is dead, and the Python
        # backend aborts on it (boost::interprocess::lock_exception): the prefix is this launch's alone
        self.remove_shm()
        env = {**kit_environment(self.install.environment()), **self.env}
        self.log_from = self.group.log_size()
        prepare = die_with_parent_thread if die_with_parent else _private
        token = self.config.restricted_token
        if token and self.config.world_size == 1:  # under mpirun the ranks' argv pass through mpirun's own
            hidden = HiddenArgs(self.argv, token)
            try:
                self.group.start(hidden.shown(), {**env, **hidden.environment()}, _traced(prepare))
            except subprocess.SubprocessError:  # tracing refused (seccomp, Yama scope 3): the plain command line
                with self.log_path.open("a") as log:
                    log.write("trtllm-kit: this system refuses ptrace, so the Triton token is on tritonserver's "
                              "command line, readable by local users\n")
            else:
                assert self.proc is not None
                hidden.reveal(self.proc.pid)
                return
        self.group.start(self.argv, env, prepare)

    def is_ready(self) -> bool:
        """``GET /v2/health/ready`` answers 200, and so does ``/metrics`` (Triton starts it last, and a benchmark
        started right after ``serve --detach`` scrapes it at once)."""
        endpoints = self.config.endpoints
        return answers(f"http://{endpoints.url('http')}/v2/health/ready") and \
            answers(f"http://{endpoints.url('metrics')}/metrics")

    def wait_ready(self, timeout_s: float, poll_s: float = 0.05) -> float:
        """Block until ready; on exit, a stub that cannot start, or ``timeout_s``, stop everything and raise.

        Arguments:
            timeout_s: seconds to wait from now.
            poll_s: seconds between polls.
        """
        started = time.perf_counter()
        endpoints = self.config.endpoints
        not_ready = self.group.wait_ready(self.is_ready, timeout_s, poll_s=poll_s,
                                           ports=(endpoints.http_port, endpoints.metrics_port),
                                           problem=self._stub_failure)
        if not_ready is None:
            return time.perf_counter() - started
        code = not_ready.exit_code
        if code is not None:
            reason = f"tritonserver exited with code {code} while starting"
            if code in (-signal.SIGABRT, 128 + signal.SIGABRT) or \
                    any(marker in self.group.log_since(self.log_from) for marker in ABORT_MARKERS):
                self.stop()
                raise StartupAbort(f"{reason} (it aborted; log {self.log_path})")
        else:
            reason = not_ready.problem or f"tritonserver was not ready after {timeout_s:g} s"
        tail = self.log_tail()
        self.stop()
        cause = self.first_error()
        reason += f": {cause}" if cause else ""
        raise KitError(f"{reason} (log {self.log_path}); last lines:\n{tail}")

    def _stub_failure(self) -> str | None:
        return "a Python-backend stub failed to start" if any(m in self.log_tail() for m in STUB_FAILURES) else None

    def wait_ready_or_restart(self, timeout_s: float, on_restart: Callable[[int], None]) -> float:
        """``wait_ready``; when the server aborted while starting, say so (one warning line), start it once more
        and wait again. Returns the seconds the last start took to be ready.

        Arguments:
            timeout_s: seconds each start may take.
            on_restart: called with the new server's pid (the reaper watches its group).
        """
        try:
            return self.wait_ready(timeout_s)
        except StartupAbort as exc:
            LOG.warning("%s; starting it once more", exc)
        self.start()
        assert self.pid is not None
        on_restart(self.pid)
        try:
            return self.wait_ready(timeout_s)
        except StartupAbort as exc:
            raise KitError(f"{exc}; it aborted twice, so it was not started again.") from None

    def first_error(self) -> str | None:
        """The message of the first error line of the log (``E1122 03:45:00.123 42 file.cc:10] message``)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return None
        for match in ERROR_LINE.finditer(text):
            message = match.group(1).strip().strip('"')
            if not any(noise in message for noise in CPU_NOISE):
                return message
        return None

    @property
    def log_path(self) -> Path:
        return self.group.log_path

    def log_tail(self, num_lines: int = 20) -> str:
        """The last ``num_lines`` lines of the server log."""
        return self.group.log_tail(num_lines)

    def stubs(self) -> dict[int, str]:
        """The live Python-backend stubs of this server: pid → the model they run."""
        import psutil

        if self.proc is None:
            return {}
        found = {}
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return {}
        for child in children:
            try:
                if child.name() == STUB_NAME and child.status() != psutil.STATUS_ZOMBIE:
                    found[child.pid] = _stub_model(child.cmdline())
            except psutil.Error:
                continue
        return found

    def stop(self, grace_s: float | None = None, *, stubs: dict[int, str] | None = None,
             is_idle: Callable[[], bool] | None = None) -> int | None:
        """SIGTERM the server (mpirun forwards it to every rank), wait, then kill whatever of the group is left.

        The grace period is for requests in flight. When ``is_idle`` can tell that nothing is left (the server
        logged that no inference is in flight, and ``is_idle`` says so before and after ``UNLOAD_GRACE_S``), the
        group is killed then rather than waiting while the server unloads its idle models one stub at a time.
        Removes the shared-memory regions of this launch's prefix. Returns the server's exit code.

        Arguments:
            grace_s: seconds in-flight requests get to finish (the server's exit timeout plus 5 s when omitted).
            stubs: the stubs the server had when it was ready; when one of them is gone, the server cannot unload
                its model and would wait out its exit timeout, so it is killed at once.
            is_idle: whether no engine holds a request (False when it cannot be known).
        """
        if self.proc is None:
            return None
        grace_s = self.config.exit_timeout_s + 5.0 if grace_s is None else grace_s
        if stubs and not set(stubs) <= set(self.stubs()):
            grace_s = 0.0
        if self.proc.poll() is None:
            graceful = grace_s > 0
            log_size = self.group.log_size()
            deadline = time.monotonic() + (grace_s if graceful else 5.0)
            self.group.signal(signal.SIGTERM if graceful else signal.SIGKILL, leader_only=graceful)
            if graceful and is_idle is not None and self._wait_drained(log_size, grace_s) and is_idle():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=UNLOAD_GRACE_S)
                if is_idle():
                    deadline = time.monotonic()
            self.group.wait_or_kill(deadline - time.monotonic())
        self._reap_group(wait_s=0.5)
        self.remove_shm()
        return self.proc.returncode

    def _wait_drained(self, log_from: int, timeout_s: float) -> bool:
        """After SIGTERM: wait until the server logs that no inference is in flight (True), or exits or
        ``timeout_s`` passes (False)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            if DRAINED_LINE in self.group.log_since(log_from):
                return True
            time.sleep(0.05)
        return False

    def _reap_group(self, wait_s: float) -> None:
        """Give the stubs ``wait_s`` to notice their server is gone, then SIGKILL the rest of the group."""
        assert self.pid is not None
        deadline = time.monotonic() + wait_s
        while group_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if group_alive(self.pid):
            self.group.signal(signal.SIGKILL)
            deadline = time.monotonic() + 2.0
            while group_alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.02)

    def protect_shm(self) -> None:
        """Make this launch's ``/dev/shm`` regions readable by their owner only (the Python backend creates them
        with mode 0644 whatever the umask, and prompts and outputs pass through them)."""
        for region in SHM_DIR.glob(f"{self.config.shm_prefix}*"):
            with contextlib.suppress(OSError):
                if region.stat().st_mode & 0o077:
                    region.chmod(0o600)

    def remove_shm(self) -> list[Path]:
        """Delete ``/dev/shm`` regions of this launch's prefix (left behind when a stub or the server was killed)."""
        removed = []
        for region in SHM_DIR.glob(f"{self.config.shm_prefix}*"):
            region.unlink(missing_ok=True)
            removed.append(region)
        return removed


def _stub_model(cmdline: list[str]) -> str:
    """The model a stub runs, from its first argument (``<repo>/<model>/<version>/model.py``)."""
    parts = Path(cmdline[1]).parts if len(cmdline) > 1 else ()
    return parts[-3] if len(parts) >= 3 else "?"
