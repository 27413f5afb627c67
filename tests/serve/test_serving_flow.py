"""The one serving flow, in process against a stand-in for the route's Triton client: one choice or several, whole
or streamed, each choice's chunks under its index, the usage counting every prompt once, and the seeds each engine
request gets."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.server.launcher import free_port
from trtllm_kit.wire import GenerationRequest, GenerationResponse

MODEL = "m"


class StandIn:
    """Answers every request with the texts "a" then "b", reporting 3 prompt tokens; keeps the requests."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    async def stream(self, gen: GenerationRequest) -> AsyncGenerator[GenerationResponse, None]:
        self.requests.append(gen)
        for i, text in enumerate(("a", "b")):
            await asyncio.sleep(0)
            yield GenerationResponse(texts=(text,), num_input_tokens=3, num_output_tokens=i + 1)

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def run_against(check: Callable[[int, StandIn], None]) -> None:
    """Start a frontend whose route answers through a ``StandIn`` and run ``check(port, stand_in)`` in a thread."""
    frontend = OpenAIFrontend(OpenAIConfig(grpc_url=f"127.0.0.1:{free_port()}", served_name=MODEL))
    stand_in = StandIn()

    async def main() -> None:
        port = free_port()
        runner = await start_frontend(frontend, "127.0.0.1", port)
        frontend.table.routes[MODEL].client = stand_in  # type: ignore[assignment]
        try:
            await asyncio.wait_for(asyncio.to_thread(check, port, stand_in), timeout=60)
        finally:
            await runner.cleanup()

    asyncio.run(main())


def post(port: int, body: dict[str, Any]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "max_tokens": 2, **body}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def events(raw: bytes) -> list[dict[str, Any]]:
    lines = [line[len("data: "):] for line in raw.decode().split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_one_choice_streamed_keeps_the_request_seed() -> None:
    def check(port: int, stand_in: StandIn) -> None:
        status, raw = post(port, {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}})
        chunks = events(raw)
        assert status == 200 and [c["choices"][0]["text"] for c in chunks[:-1]] == ["a", "b", ""]
        assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "length"]
        assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        assert [gen.seed for gen in stand_in.requests] == [None]  # the engine draws its own

    run_against(check)


def test_several_choices_whole_count_the_prompt_once() -> None:
    def check(port: int, stand_in: StandIn) -> None:
        status, raw = post(port, {"prompt": "hi", "n": 2, "seed": 5})
        answer = json.loads(raw)
        assert status == 200 and [(c["index"], c["text"]) for c in answer["choices"]] == [(0, "ab"), (1, "ab")]
        assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        assert sorted(gen.seed for gen in stand_in.requests) == [5, 6]  # choice j samples with seed + j

    run_against(check)


def test_several_prompts_and_choices_streamed_under_their_indices() -> None:
    def check(port: int, stand_in: StandIn) -> None:
        status, raw = post(port, {"prompt": ["x", "y"], "n": 2, "stream": True})
        chunks = events(raw)
        by_index: dict[int, str] = {}
        for chunk in chunks:
            choice = chunk["choices"][0]
            by_index[choice["index"]] = by_index.get(choice["index"], "") + choice["text"]
        assert status == 200 and by_index == {0: "ab", 1: "ab", 2: "ab", 3: "ab"}
        assert sum(c["choices"][0]["finish_reason"] == "length" for c in chunks) == 4
        assert [gen.prompt for gen in stand_in.requests].count("y") == 2

    run_against(check)
