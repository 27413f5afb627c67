"""Two priority classes at overload against a real served tiny Llama (CPU runtime, 4 batch slots): a high-priority
request that arrives while every slot runs a long low-priority request and more low ones wait is answered before any
of the waiting ones starts (it preempts a running one rather than queueing behind them); that a preempted request
keeps its tokens is ``tests/runtime/test_priority.py``'s. The comparison is of the order events happen in, not of
their times, so a loaded machine cannot change its outcome."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from kit_server import BuildKey, KitServer, Servers
from prometheus_client.parser import text_string_to_metric_families

from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.requests import CompletionRequest
from trtllm_kit.serve.openai.sampling_fields import trtllm_priority

MODEL = "builtin:tiny-llama"
SLOTS = 4
LONG = 960  # new tokens of each running request: hundreds of steps beyond the high one's few; left, not awaited
WAIT_S = 120  # bound on any one wait below; a healthy run waits a fraction of it


def test_openai_priority_maps_onto_trtllm_float() -> None:
    assert [trtllm_priority(p) for p in (-100, -50, 0, 50, 100)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert CompletionRequest.parse({"prompt": "p", "priority": -3}).priority == -3
    for bad in (101, 1.5, True, "high"):
        with pytest.raises(HTTPError, match=r"priority must be an integer from -100 to 100 \(lower runs first\)"):
            CompletionRequest.parse({"prompt": "p", "priority": bad})


@pytest.fixture(scope="module")
def server(kit_servers: Servers) -> KitServer:
    torch.set_num_threads(1)
    return kit_servers.get(BuildKey.of(max_batch_size=SLOTS))


def waiting_requests(server: KitServer) -> float:
    """The engine's waiting requests, as its Triton metrics say."""
    text = urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=WAIT_S).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "nv_trt_llm_request_metrics" and sample.labels.get("request_type") == "waiting":
                return sample.value
    raise AssertionError("the metrics have no nv_trt_llm_request_metrics{request_type=\"waiting\"}")


class Stream:
    """One streamed token-id completion, read to its end on a thread of its own: when its first token and its end
    came, as places in one order shared by every stream of the test (``Order``)."""

    def __init__(self, order: Order, prompt: list[int], max_tokens: int, priority: int) -> None:
        self.order, self.prompt, self.max_tokens, self.priority = order, prompt, max_tokens, priority
        self.first_token, self.ended = threading.Event(), threading.Event()
        self.first_at: int | None = None
        self.tokens = 0
        self.closed = False
        self._connection: http.client.HTTPConnection | None = None

    def run(self, port: int) -> int:
        body = {"model": MODEL, "prompt": self.prompt, "max_tokens": self.max_tokens, "ignore_eos": True,
                "stream": True, "priority": self.priority}
        connection = self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
        try:
            connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200, response.read()
            for line in response:
                if not line.startswith(b"data: {"):
                    continue
                ids = json.loads(line[6:])["choices"][0].get("token_ids") or []
                if ids and self.first_at is None:
                    self.first_at = self.order.next()
                    self.first_token.set()
                self.tokens += len(ids)
        except OSError:
            if not self.closed:
                raise
        finally:
            connection.close()
            self.ended.set()
        return self.tokens

    def close(self) -> None:
        """Leave the stream: the server frees its request."""
        self.closed = True
        if self._connection is not None and self._connection.sock is not None:
            self._connection.sock.shutdown(socket.SHUT_RDWR)


class Order:
    """A counter the streams take their places from."""

    def __init__(self) -> None:
        self._lock, self._n = threading.Lock(), 0

    def next(self) -> int:
        with self._lock:
            self._n += 1
            return self._n


def wait(event: threading.Event, what: str) -> None:
    assert event.wait(WAIT_S), f"{what} did not happen within {WAIT_S} s"


@pytest.mark.integration
def test_a_high_priority_request_runs_before_the_low_ones_waiting_for_a_slot(server: KitServer) -> None:
    g, order = np.random.default_rng(0), Order()

    def stream(max_tokens: int, priority: int) -> Stream:
        return Stream(order, g.integers(0, 1000, 16).tolist(), max_tokens, priority)

    running = [stream(LONG, 10) for _ in range(SLOTS)]  # they hold every slot far past the high one's end
    waiting = [stream(8, 10) for _ in range(SLOTS)]
    high = stream(4, -10)
    with ThreadPoolExecutor(2 * SLOTS + 1) as pool:
        done = [pool.submit(s.run, server.port) for s in running]
        for s in running:
            wait(s.first_token, "a first token of a running low-priority request")
        done += [pool.submit(s.run, server.port) for s in waiting]
        for _ in range(WAIT_S * 20):  # until the engine queues them (polled every 50 ms)
            if waiting_requests(server) == SLOTS:
                break
            threading.Event().wait(0.05)
        assert not any(s.first_token.is_set() for s in waiting), "a low-priority request started beyond the slots"
        done.append(pool.submit(high.run, server.port))
        wait(high.ended, "the end of the high-priority request")
        high_ended_at = order.next()
        started_before = [s.first_at for s in waiting if s.first_at is not None and s.first_at < high_ended_at]
        for s in running:  # their slots go to the waiting requests
            s.close()
        counts = [f.result(timeout=WAIT_S) for f in done[SLOTS:]]
    assert started_before == [], "a waiting low-priority request started before the high-priority one was answered"
    assert counts == [8] * SLOTS + [4]
