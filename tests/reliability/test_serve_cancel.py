"""Item 1 against a real tritonserver: a client that leaves stops its generation within a step or two, for text
prompts (OpenAI frontend → BLS, streamed or not; gRPC → BLS) as for token-id prompts.

Before the fix a text-prompt stream dropped after 3 events ran on to max_tokens: 894 engine steps and 12.5 s
on this machine (``benchmarks``-free measure: the CPU runtime's iteration counter after the socket closed).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from serving_helpers import LONG, assert_stops, counters, leave_a_whole_request, open_stream

from trtllm_kit.serve.client import TextClient
from trtllm_kit.wire import GenerationRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("prompt", ["Hello there", [1, 5, 6]], ids=["text", "token-ids"])
def test_a_dropped_stream_stops_the_engine(served: dict[str, Any], prompt: Any) -> None:
    sock = open_stream(served, {**LONG, "prompt": prompt, "stream": True})
    before = counters(served)
    sock.close()
    assert_stops(served, before)


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
