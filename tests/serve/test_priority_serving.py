"""Two priority classes at overload against a real served tiny Llama (CPU runtime, 4 batch slots): the high
class's p99 time to first token stays below the low class's median while the low class absorbs the queueing
(a comparison within one run, so a loaded machine slows both classes alike)."""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from kit_server import BuildKey, Servers

from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.requests import CompletionRequest
from trtllm_kit.serve.openai.sampling_fields import trtllm_priority

MODEL = "builtin:tiny-llama"


def test_openai_priority_maps_onto_trtllm_float() -> None:
    assert [trtllm_priority(p) for p in (-100, -50, 0, 50, 100)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert CompletionRequest.parse({"prompt": "p", "priority": -3}).priority == -3
    for bad in (101, 1.5, True, "high"):
        with pytest.raises(HTTPError, match=r"priority must be an integer from -100 to 100 \(lower runs first\)"):
            CompletionRequest.parse({"prompt": "p", "priority": bad})


@pytest.fixture(scope="module")
def openai_port(kit_servers: Servers) -> int:
    torch.set_num_threads(1)
    return kit_servers.get(BuildKey.of(max_batch_size=4)).port


def ttft(port: int, prompt: list[int], max_tokens: int, priority: int) -> float:
    """Seconds from sending a streamed token-id completion to its first token; reads the stream to its end."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "priority": priority}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    started = time.perf_counter()
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200, response.read()
    first = None
    for line in response:
        if line.startswith(b"data: {") and first is None and json.loads(line[6:])["choices"][0].get("token_ids"):
            first = time.perf_counter() - started
    connection.close()
    assert first is not None
    return first


@pytest.mark.integration
@pytest.mark.slow
def test_high_priority_ttft_stays_bounded_while_low_priority_queues(openai_port: int) -> None:
    g = np.random.default_rng(0)
    with ThreadPoolExecutor(20) as pool:
        lows = [pool.submit(ttft, openai_port, g.integers(0, 1000, 16).tolist(), 48, 10) for _ in range(12)]
        time.sleep(1.0)  # the four slots are busy and eight low requests wait
        highs = []
        for _ in range(8):
            highs.append(pool.submit(ttft, openai_port, g.integers(0, 1000, 16).tolist(), 4, -10))
            time.sleep(0.1)
        high_s, low_s = [f.result() for f in highs], [f.result() for f in lows]
    high_p99, low_p50 = float(np.percentile(high_s, 99)), float(np.percentile(low_s, 50))
    print(f"high p99 TTFT {high_p99:.3f} s, low p50 TTFT {low_p50:.3f} s, low max {max(low_s):.3f} s")
    assert high_p99 < low_p50
