"""``trtllm-kit serve OUT --disagg`` on the CPU: a context and a generation tritonserver behind the OpenAI frontend's
two-step request. 50 completions of mixed lengths, streamed and whole, are token-exact against aggregated serving of
the same llmapi artifact; afterwards, and after clients that leave mid-stream or between the two steps, both
servers' KV block gauges show every block free and the context server holds nothing."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from kit_server import TINY_BUILDS, Builds, KitServer

from trtllm_kit.serve.service import stop_serving

pytestmark = pytest.mark.slow

MODEL = "builtin:tiny-llama"
NUM_REQUESTS = 50
TIMEOUT_S = 2.0  # --kv-transfer-timeout: blocks of a context request nobody fetches


@pytest.fixture(scope="module")
def out(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kit_builds.copy(TINY_BUILDS["llmapi"], tmp_path_factory.mktemp("disagg") / "out")


def requests() -> list[dict]:
    g = np.random.default_rng(0)
    made = []
    for i in range(NUM_REQUESTS):
        prompt = g.integers(3, 1000, int(g.integers(1, 120))).tolist()
        made.append({"model": MODEL, "prompt": prompt, "max_tokens": int(g.integers(1, 24)), "temperature": 0,
                     "stream": bool(i % 2)})
    return made


def complete(port: int, body: dict) -> list[int] | tuple[str, int]:
    """A streamed answer's token ids; a whole answer's text and token count (it carries no ids)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        if not body["stream"]:
            answer = json.loads(response.read())
            return answer["choices"][0]["text"], answer["usage"]["completion_tokens"]
        ids: list[int] = []
        for line in response:
            if line.startswith(b"data: {"):
                ids += json.loads(line[6:])["choices"][0].get("token_ids") or []
        return ids
    finally:
        connection.close()


def served(out: Path, **settings) -> tuple[int, dict]:
    server = KitServer(out, **settings).start()
    return server.port, server.state


def gauge(metrics_url: str, family: str, label: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    found = re.findall(rf'^{family}{{[^}}]*="{label}"[^}}]*}} (\S+)$', text, re.MULTILINE)
    assert found, f"{family} {label} not on {metrics_url}"
    return float(found[0])


def settles(state: dict) -> bool:
    """Whether, within 30 s, both roles show no used KV block and the context server holds no request."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        used = [gauge(state[role]["metrics"], "nv_trt_llm_kv_cache_block_metrics", "used")
                for role in ("context", "generation")]
        held = gauge(state["context"]["metrics"], "trtllm_kit_kv_transfer_metrics", "held")
        if used == [0, 0] and held == 0:
            return True
        time.sleep(0.25)
    return False


def leave(port: int, body: dict, after_bytes: int) -> None:
    """Send a streamed request and close the connection after ``after_bytes`` of the answer (0: at once)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        data = json.dumps(body).encode()
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        received = b""
        while len(received) < after_bytes:
            chunk = conn.recv(4096)
            if not chunk:
                break
            received += chunk


@pytest.mark.integration
def test_disaggregated_serving_is_token_exact_and_leaks_no_blocks(out: Path) -> None:
    bodies = requests()
    port, _ = served(out)
    try:
        expected = [complete(port, body) for body in bodies]
    finally:
        stop_serving(out, 30)
    port, state = served(out, disagg=True, kv_transfer_timeout_s=TIMEOUT_S)
    try:
        assert state["disagg"] and state["context"]["grpc"] != state["generation"]["grpc"]
        got = [complete(port, body) for body in bodies]
        mismatched = [i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b]
        assert not mismatched, [(bodies[i]["prompt"], expected[i], got[i]) for i in mismatched[:3]]
        assert settles(state)
        assert gauge(state["generation"]["metrics"], "trtllm_kit_kv_transfer_metrics", "transfers") > 0
        long = {"model": MODEL, "prompt": list(range(3, 400)), "max_tokens": 200, "ignore_eos": True, "stream": True}
        for after_bytes in (0, 1, 300, 2000):  # at once (during the context step), and at points of the stream
            leave(port, long, after_bytes)
        assert settles(state)
        assert complete(port, bodies[1]) == expected[1]  # still serving
    finally:
        stop_serving(out, 30)
