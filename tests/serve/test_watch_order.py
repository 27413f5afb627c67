"""What the serve's watch names when a stub and tritonserver both end: the one that ended first, whichever order
the watch sees them in (real processes, real exit statuses)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from trtllm_kit.serve.server.watch import Watch


@dataclass
class EndedServer:
    """The part of ``TritonProcess`` the watch reads: the server's process, and the stubs alive now."""

    proc: subprocess.Popen[bytes]
    alive: dict[int, str] = field(default_factory=dict)

    def protect_shm(self) -> None:
        pass

    def stubs(self) -> dict[int, str]:
        return self.alive


def _ended(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code])
    proc.wait(timeout=60)
    return proc


@pytest.mark.parametrize(("code", "status"), [("import os; os.abort()", -signal.SIGABRT),
                                              ("raise SystemExit(1)", 1)])
def test_a_server_that_ends_after_its_stub_died_names_the_stub(code: str, status: int) -> None:
    watch = Watch(EndedServer(_ended(code)), stubs={4242: "tensorrt_llm"})  # type: ignore[arg-type]
    assert watch.failure() == ("the Python-backend stub of model tensorrt_llm (pid 4242) died while serving "
                               f"(tritonserver exited after it, with code {status})")


def test_a_killed_server_is_named_even_when_its_stubs_are_gone_too() -> None:
    watch = Watch(EndedServer(_ended("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")),
                  stubs={4242: "tensorrt_llm"})  # type: ignore[arg-type]
    assert watch.failure() == "tritonserver exited with code -9 while serving"


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_dead_stub_under_a_living_server_is_named() -> None:
    server, stub = _sleeper(), _sleeper()
    try:
        watch = Watch(EndedServer(server, alive={stub.pid: "postprocessing"}),  # type: ignore[arg-type]
                      stubs={stub.pid: "postprocessing", 4242: "tensorrt_llm"})
        assert watch.failure() == "the Python-backend stub of model tensorrt_llm (pid 4242) died while serving"
    finally:
        for proc in (server, stub):
            proc.kill()
            proc.wait()


@dataclass
class UnwalkedServer(EndedServer):
    """A server whose process table the watch must not walk while it follows every stub's pidfd."""

    walks: int = 0

    def stubs(self) -> dict[int, str]:
        self.walks += 1
        return self.alive  # none: were it read, every stub would look dead


def test_a_stub_death_is_seen_from_its_pidfd_without_walking_the_process_table() -> None:
    server, stub, other = _sleeper(), _sleeper(), _sleeper()
    try:
        walked = UnwalkedServer(server)
        watch = Watch(walked, stubs={stub.pid: "tensorrt_llm", other.pid: "postprocessing"})  # type: ignore[arg-type]
        assert watch.failure() is None
        stub.kill()
        stub.wait()
        deadline = time.monotonic() + 60  # a bound, not a measurement
        while (failure := watch.failure()) is None:
            assert time.monotonic() < deadline, "the stub's death was not seen"
            time.sleep(0.01)
        assert failure == f"the Python-backend stub of model tensorrt_llm (pid {stub.pid}) died while serving"
        assert walked.walks == 0
    finally:
        for proc in (server, stub, other):
            proc.kill()
            proc.wait()
