"""What the serving reliability tests share: a served copy of the tiny artifact, the CPU runtime's counters,
raw HTTP clients that can leave mid-stream, a long request and the check that the engine stops when its client
leaves, and the processes and shared memory a server leaves behind."""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from kit_server import KitServer
from kit_server import open_stream as open_stream  # the raw client these tests leave mid-stream, said once there
from polling import wait_until
from prometheus_client.parser import text_string_to_metric_families

MODEL = "builtin:tiny-llama"  # the served name
STUB = "triton_python_backend_stub"
LONG = {"model": MODEL, "prompt": "Hello there", "max_tokens": 900, "ignore_eos": True, "temperature": 0}
HANG_S = 60  # hang guards only: every bound is what a loaded machine may need, never a speed claim
MAX_STEPS = 300  # engine steps, not seconds, between a client's leaving and the engine's stop: the disconnect's way
# through aiohttp, gRPC, Triton and the BLS, which the engine steps through without waiting for its sends (the
# outbox): 2-6 steps idle, 121 seen in a run of the suite on a 2-core machine; a request that ran on would take
# all of LONG's 900


def serve(out: Path, *, api_key: str | None = None, **settings: Any) -> dict[str, Any]:
    """``trtllm-kit serve OUT --detach`` (a ``KitServer``) on free loopback ports with the OpenAI frontend; its state
    and ``out``.

    Arguments:
        out: the build output (a copy the test owns); api_key: the key clients send (``TRTLLM_KIT_API_KEY``);
        settings: further ``ServeSettings``, e.g. ``engine_watchdog_s=3`` or ``api_keys=PATH``.
    """
    server = KitServer(out, api_key=api_key, **settings).start()
    return {**server.state, "out": out}


def counters(state: dict[str, Any]) -> dict[str, float]:
    """The CPU runtime's ``steps`` (iteration counter), ``active`` and ``waiting`` requests, from Triton's /metrics."""
    with urllib.request.urlopen(f"http://{state['metrics']}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "nv_trt_llm_general_metrics" and sample.labels["general_type"] == "iteration_counter":
                found["steps"] = sample.value
            if family.name == "nv_trt_llm_request_metrics" and sample.labels["request_type"] in ("active", "waiting"):
                found[sample.labels["request_type"]] = sample.value
    return found


def wait_idle(state: dict[str, Any], timeout_s: float) -> tuple[float, dict[str, float]]:
    """Seconds until the engine has no active request (or ``timeout_s``), and the counters then."""
    started = time.perf_counter()
    while True:
        now = counters(state)
        if now["active"] == 0 or time.perf_counter() - started > timeout_s:
            return time.perf_counter() - started, now
        time.sleep(0.02)


def assert_stops(state: dict[str, Any], before: dict[str, float]) -> None:
    """The engine has no active request and made at most ``MAX_STEPS`` steps since ``before`` (its counters when
    the client left)."""
    _, after = wait_idle(state, timeout_s=HANG_S)
    assert after["active"] == 0, after
    assert after["steps"] - before["steps"] <= MAX_STEPS, (before, after)


def leave_a_whole_request(state: dict[str, Any]) -> dict[str, float]:
    """Send ``LONG`` not streamed (nothing comes back until the end), leave once the engine has made 5 steps of it;
    the counters just before leaving."""
    start = counters(state)["steps"]
    sock = open_stream(state, LONG, num_events=0)
    wait_until(lambda: counters(state)["steps"] >= start + 5, HANG_S, 0.01)  # generation under way
    before = counters(state)
    assert before["active"] == 1 and before["steps"] >= start + 5, before
    sock.close()
    return before


def read_rest(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends until it closes, ends the chunked body or ``timeout_s`` passes."""
    sock.settimeout(timeout_s)
    received = b""
    try:
        while not received.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    except (TimeoutError, OSError):
        pass
    return received


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """POST raw bytes; the status, headers and body, errors included."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def ready(state: dict[str, Any]) -> bool:
    """Whether Triton answers ``/v2/health/ready`` with 200."""
    try:
        with urllib.request.urlopen(f"http://{state['http']}/v2/health/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def serve_exits(pid: int, timeout_s: float) -> bool:
    """Whether the serve ``pid`` has ended (or is a zombie) within ``timeout_s``."""
    def ended() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return wait_until(ended, timeout_s, 0.05)


def server_processes(state: dict[str, Any]) -> list[psutil.Process]:
    """Live processes of the server: its process group, and every stub or server naming its shm prefix."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            in_group = state.get("server_pid") is not None and _pgid(proc.pid) == state["server_pid"]
            names_prefix = any(state["shm_prefix"] in part for part in proc.info["cmdline"] or [])
            if in_group or names_prefix:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def shm_regions(state: dict[str, Any]) -> list[Path]:
    return sorted(Path("/dev/shm").glob(f"{state['shm_prefix']}*"))


def wait_gone(state: dict[str, Any], timeout_s: float) -> float:
    """Seconds until no process or shm region of the server is left; fails after ``timeout_s``."""
    started = time.perf_counter()
    while server_processes(state) or shm_regions(state):
        assert time.perf_counter() - started < timeout_s, (server_processes(state), shm_regions(state))
        time.sleep(0.05)
    return time.perf_counter() - started


def stubs(state: dict[str, Any]) -> dict[str, int]:
    """model name → pid of the server's Python-backend stubs."""
    return {name: int(pid) for pid, name in state["stubs"].items()}
