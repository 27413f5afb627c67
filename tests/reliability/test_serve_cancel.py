"""Item 1 against a real tritonserver: a client that leaves stops its generation within a step or two, for text
prompts (OpenAI frontend → BLS, streamed or not; gRPC → BLS) as for token-id prompts.

Before the fix a text-prompt stream dropped after 3 events ran on to max_tokens: 894 engine steps and 12.5 s
on this machine (``benchmarks``-free measure: the CPU runtime's iteration counter after the socket closed).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from serving_helpers import MODEL, counters, open_stream, wait_idle

from trtllm_kit.serve.client import TextClient
from trtllm_kit.wire import GenerationRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LONG = {"model": MODEL, "max_tokens": 900, "ignore_eos": True, "temperature": 0}
MAX_STEPS = 300  # engine steps, not seconds: the disconnect's way through aiohttp, gRPC, Triton and the BLS, which
# the engine steps through without waiting for its sends (the outbox): 2-6 steps idle, 121 seen in a run of the
# suite on a 2-core machine; a stream that ran on would take all 900
HANG_S = 60  # a hang guard only


def assert_stops(state: dict[str, Any], before: dict[str, float]) -> None:
    _, after = wait_idle(state, timeout_s=HANG_S)
    assert after["active"] == 0, after
    assert after["steps"] - before["steps"] <= MAX_STEPS, (before, after)


@pytest.mark.parametrize("prompt", ["Hello there", [1, 5, 6]], ids=["text", "token-ids"])
def test_a_dropped_stream_stops_the_engine(served: dict[str, Any], prompt: Any) -> None:
    sock = open_stream(served, {**LONG, "prompt": prompt, "stream": True})
    before = counters(served)
    sock.close()
    assert_stops(served, before)


def leave_a_whole_request(state: dict[str, Any]) -> dict[str, float]:
    """Send a long request not streamed (nothing comes back until the end), leave once the engine has made 5 steps
    of it; the counters just before leaving."""
    start = counters(state)["steps"]
    sock = open_stream(state, {**LONG, "prompt": "Hello there"}, num_events=0)
    deadline = time.monotonic() + HANG_S
    while counters(state)["steps"] < start + 5 and time.monotonic() < deadline:  # generation under way
        time.sleep(0.01)
    before = counters(state)
    assert before["active"] == 1 and before["steps"] >= start + 5, before
    sock.close()
    return before


def test_a_dropped_whole_request_stops_the_engine(served: dict[str, Any]) -> None:
    assert_stops(served, leave_a_whole_request(served))


def test_a_cancelled_grpc_stream_to_the_bls_stops_the_engine(served: dict[str, Any]) -> None:
    async def leave_after_three() -> dict[str, float]:
        client = TextClient(served["grpc"], "tensorrt_llm_bls")
        stream = client.stream(GenerationRequest("Hello there", 900, top_k=1, end_id=-1))
        for _ in range(3):
            await anext(stream)
        before = counters(served)
        await stream.aclose()  # cancels the gRPC call
        await client.close()
        return before

    assert_stops(served, asyncio.run(leave_after_three()))
