"""``serve --disagg`` (no key) attacked as a client who reaches the generation tritonserver's HTTP port, and killed
with SIGKILL: the generation server connects only to KV endpoints its context peer signed, a forged header from a
peer that holds the key ends that request alone with a 400, and no KV socket directory outlives a killed context
server or serve.

Before the fix: a ``generation_only`` request naming the test's own socket made the generation server connect and
write to it, and the 400 said which paths exist; a forged header (a shape of 1e30, of 2^46 elements) killed the
fetching thread and the request was never answered; a SIGKILLed context server left ``/tmp/trtllm-kit-kv-*``."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from kit_server import TINY_BUILDS, Builds, KitServer
from kv_peer import KvPeer, header, signed_state, unsigned_state, wire

from trtllm_kit.llmapi.kv_state import KV_KEY_ENV
from trtllm_kit.serve.service import stop_serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "builtin:tiny-llama"
PROMPT = [1, 415, 565]
HANG_S = 60  # hang guards only, never a speed claim
STUB = "triton_python_backend_stub"


@pytest.fixture(scope="module")
def out(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kit_builds.copy(TINY_BUILDS["llmapi"], tmp_path_factory.mktemp("disagg-trust") / "out")


def serve_disagg(out: Path) -> tuple[int, dict[str, Any]]:
    server = KitServer(out, disagg=True).start()
    return server.port, server.state


@pytest.fixture(scope="module")
def served(out: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    port, state = serve_disagg(out)
    yield port, state
    stop_serving(out, 30)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private directory whose socket paths stay far below the 107-byte limit."""
    path = Path(tempfile.mkdtemp(prefix="kvt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def post(host_port: str, path: str, body: dict) -> tuple[int, bytes]:
    host, port = host_port.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=HANG_S)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def generation_only(state: dict[str, Any], opaque_state: bytes) -> tuple[int, str]:
    """A generation-only request straight to the generation tritonserver, as any client of its port can send."""
    body = {"input_ids": PROMPT, "sampling_param_max_tokens": 4,
            "disaggregated_params": json.dumps(wire(opaque_state))}
    status, answer = post(state["generation"]["http"], "/v2/models/tensorrt_llm/generate", body)
    return status, answer.decode(errors="replace")


def completion(port: int) -> str:
    status, answer = post(f"127.0.0.1:{port}", "/v1/completions",
                          {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0})
    assert status == 200, answer
    return json.loads(answer)["choices"][0]["text"]


def transfer_key(pid: int) -> str:
    """The transfer key in a process's environment (readable by its own user, as this test is)."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    found = [entry.split(b"=", 1)[1] for entry in entries if entry.startswith(KV_KEY_ENV.encode() + b"=")]
    assert found, f"{KV_KEY_ENV} is not in the environment of {pid}"
    return found[0].decode()


def test_the_generation_server_connects_only_to_endpoints_its_context_peer_signed(served, short_dir: Path) -> None:
    port, state = served
    expected = completion(port)
    peer = KvPeer(short_dir / "peer.sock", header() + b"\0" * 64)
    try:
        answers = {}
        for path in (str(peer.path), str(short_dir / "nothing-here.sock"), "/etc/passwd", str(short_dir)):
            status, answer = generation_only(state, unsigned_state(path))
            assert status == 400 and "encoded_opaque_state" in answer, (path, status, answer)
            answers[path] = answer
        assert len(set(answers.values())) == 1, answers  # nothing tells which of the paths exist
        assert str(short_dir) not in answers[str(peer.path)]
        status, answer = generation_only(state, signed_state("not this serve's key", str(peer.path)))
        assert status == 400 and "signature does not match" in answer, answer
        time.sleep(0.5)
        assert peer.num_connections == 0
    finally:
        peer.close()
    assert completion(port) == expected


@pytest.mark.parametrize("shape", [[1e30, 1, 32, 2, 64], [2 ** 10, 2 ** 10, 2 ** 10, 2 ** 10, 2 ** 6]])
def test_a_forged_header_from_a_peer_with_the_key_is_a_400_for_that_request_alone(served, short_dir: Path,
                                                                                  shape: list) -> None:
    port, state = served
    expected = completion(port)
    peer = KvPeer(short_dir / "peer.sock", header(shape=shape))
    try:
        status, answer = generation_only(state, signed_state(transfer_key(state["generation"]["pid"]),
                                                              str(peer.path)))
        assert status == 400 and "the KV transfer header's shape is" in answer, (status, answer)
        assert str(short_dir) not in answer
        assert peer.num_connections == 1
    finally:
        peer.close()
    assert completion(port) == expected


def kv_dirs(root: Path) -> list[Path]:
    return sorted(root.glob("trtllm-kit-kv-*"))


def gone(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in pids):
            return True
        time.sleep(0.05)
    return False


def victim(state: dict[str, Any], which: str) -> int:
    if which == "context stub":
        children = psutil.Process(state["context"]["pid"]).children()
        return next(child.pid for child in children if STUB in " ".join(child.cmdline()))
    return state["context"]["pid"] if which == "context tritonserver" else state["pid"]


@pytest.mark.parametrize("which", ["context stub", "context tritonserver", "serve"])
def test_a_killed_context_server_or_serve_leaves_no_kv_directory(out: Path, short_dir: Path, which: str,
                                                                 tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out = Path(shutil.copytree(out, tmp_path / "out"))  # a copy of its own: the module's serve holds the original
    monkeypatch.setenv("TMPDIR", str(short_dir))  # the serve's and its servers' temporary directory
    port, state = serve_disagg(out)
    try:
        pids = [state["pid"], state["context"]["pid"], state["generation"]["pid"]]
        completion(port)
        assert len(kv_dirs(short_dir)) == 1  # the context server's socket directory
        os.kill(victim(state, which), signal.SIGKILL)
        assert gone(pids, HANG_S)
        deadline = time.monotonic() + HANG_S
        while kv_dirs(short_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert kv_dirs(short_dir) == []
    finally:
        stop_serving(out, 30)


def test_the_transfer_key_is_not_in_state_or_on_a_command_line(served) -> None:
    _, state = served
    key = transfer_key(state["generation"]["pid"])
    assert key == transfer_key(state["context"]["pid"])
    assert key not in json.dumps(state)
    for pid in (state["pid"], state["context"]["pid"], state["generation"]["pid"]):
        assert key not in " ".join(psutil.Process(pid).cmdline())
