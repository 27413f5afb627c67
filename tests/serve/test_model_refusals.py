"""A request the OpenAI parse lets through and a Triton model refuses (INVALID_ARG) reaches the client as a 400
(``invalid_request_error``) carrying the model's sentence, ``param`` naming the OpenAI field the sentence names; the
runtime's own failures stay 500. On the shared served cpu build: the CPU runtime refuses ``length_penalty`` other
than 1.0 (it has no beam search), through the ``openai`` client and raw HTTP, whole and streamed; the kit's gRPC
client gets the status of the model's refusals itself (token ids outside the model's vocabulary, beams), from the code
that marks its message, and Triton serves on after many at once. A refusal after a stream began is an error event
before ``[DONE]`` (in process, against a stand-in for the route's client)."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import AsyncGenerator
from typing import Any

import openai
import pytest
import torch
from kit_server import BuildKey, KitServer, Servers

from trtllm_kit.serve.client import TextClient
from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.errors import generation_failure
from trtllm_kit.serve.server.launcher import free_port
from trtllm_kit.wire import GenerationRequest, GenerationResponse

pytestmark = [pytest.mark.integration]
MODEL = "builtin:tiny-llama"
REFUSED = "tensorrt_llm: input length_penalty = 2.0 is not supported by the CPU runtime (only 1.0); leave it out."
PROMPTS = {"text": "The capital of France is", "token ids": [1, 45, 300]}


@pytest.fixture(scope="module")
def server(kit_servers: Servers) -> KitServer:
    torch.set_num_threads(1)
    return kit_servers.get(BuildKey.of())


def _error(info: pytest.ExceptionInfo[openai.BadRequestError]) -> dict[str, object]:
    body = info.value.body
    assert isinstance(body, dict)
    return body


@pytest.mark.parametrize("prompt", PROMPTS.values(), ids=PROMPTS.keys())
def test_a_completion_the_runtime_refuses_is_a_400_naming_its_field(server: KitServer,
                                                                      prompt: str | list[int]) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                           extra_body={"length_penalty": 2.0})
    assert info.value.status_code == 400
    assert _error(info) == {"message": REFUSED, "type": "invalid_request_error", "param": "length_penalty",
                            "code": None}


def test_a_chat_completion_the_runtime_refuses_is_a_400_naming_its_field(server: KitServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=4, extra_body={"length_penalty": 2.0})
    assert info.value.status_code == 400
    assert _error(info)["param"] == "length_penalty" and _error(info)["message"] == REFUSED


@pytest.mark.parametrize("path, fields", [
    ("/v1/completions", {"prompt": PROMPTS["text"]}),
    ("/v1/completions", {"prompt": PROMPTS["token ids"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
], ids=["completion", "completion of token ids", "chat"])
def test_a_streamed_refusal_is_a_400_before_any_event(server: KitServer, path: str, fields: dict[str, object]) -> None:
    body = {"model": MODEL, "max_tokens": 4, "stream": True, "length_penalty": 2.0, **fields}
    status, headers, raw = server.post(path, json.dumps(body).encode())
    assert status == 400 and headers["Content-Type"].startswith("application/json"), raw
    assert json.loads(raw) == {"error": {"message": REFUSED, "type": "invalid_request_error",
                                         "param": "length_penalty", "code": None}}


def test_the_runtimes_own_length_penalty_is_served(server: KitServer) -> None:
    answer = server.client().completions.create(model=MODEL, prompt=PROMPTS["text"], max_tokens=4,
                                                extra_body={"length_penalty": 1.0})
    assert answer.choices[0].finish_reason == "length" and answer.usage is not None
    assert answer.usage.completion_tokens == 4


@pytest.mark.parametrize("fields, message", [
    ({"prompt": (1, 5000)}, "tensorrt_llm: input_ids hold a token outside the vocabulary [0, 1031)."),
    ({"beam_width": 2}, "tensorrt_llm: input beam_width = 2 is not supported by the CPU runtime (only 1); leave it "
                        "out."),
    ({"length_penalty": 0.5}, "tensorrt_llm: input len_penalty = 0.5 is not supported by the CPU runtime (only "
                              "1.0); leave it out."),
], ids=["vocabulary", "beam_width", "len_penalty"])
def test_the_grpc_client_gets_a_refusal_as_400(server: KitServer, fields: dict[str, Any], message: str) -> None:
    async def generate() -> GenerationError:
        client = TextClient(server.grpc)
        request = GenerationRequest(**{"prompt": (1, 45, 300), "max_tokens": 4, **fields})
        try:
            with pytest.raises(GenerationError) as info:
                async for _ in client.stream(request):
                    pass
        finally:
            await client.close()
        return info.value

    refused = asyncio.run(generate())
    assert (refused.status, str(refused)) == (400, message)


def test_refusals_from_concurrent_clients_leave_the_server_serving(server: KitServer) -> None:
    """Each refusal is a 400 and Triton lives on: with the stream's status carrying the code
    (``triton_grpc_error``), Triton 2.51 aborted after some hundreds of these under load."""
    refusals = ({"prompt": (1, 5000)}, {"beam_width": 2}, {"length_penalty": 0.5})

    async def refused(fields: dict[str, Any]) -> int:
        client = TextClient(server.grpc)
        try:
            async for _ in client.stream(GenerationRequest(**{"prompt": (1, 45, 300), "max_tokens": 4, **fields})):
                pass
        except GenerationError as exc:
            return exc.status
        finally:
            await client.close()
        return 200

    async def rounds() -> list[int]:
        statuses = []
        for _ in range(8):
            for fields in refusals:
                statuses += await asyncio.gather(*(refused(fields) for _ in range(8)))
        return statuses

    assert asyncio.run(rounds()) == [400] * 8 * len(refusals) * 8
    answer = server.client().completions.create(model=MODEL, prompt=PROMPTS["text"], max_tokens=4)
    assert answer.usage is not None and answer.usage.completion_tokens == 4


@pytest.mark.parametrize("status, message, expected", [
    (400, "tensorrt_llm: input len_penalty = 0.5 is not supported by the CPU runtime (only 1.0); leave it out.",
     (400, "invalid_request_error", "length_penalty",
      "tensorrt_llm: input length_penalty = 0.5 is not supported by the CPU runtime (only 1.0); leave it out.")),
    (400, "tensorrt_llm: min_tokens must lie in [0, request_output_len=4], got 9.",
     (400, "invalid_request_error", "min_tokens", "tensorrt_llm: min_tokens must lie in [0, request_output_len=4], "
                                                  "got 9.")),
    (400, "runtime_top_k must be >= 0, got -1.",
     (400, "invalid_request_error", "top_k", "top_k must be >= 0, got -1.")),
    (400, "tensorrt_llm: input_ids hold a token outside the vocabulary [0, 1031).",
     (400, "invalid_request_error", None, "tensorrt_llm: input_ids hold a token outside the vocabulary [0, 1031).")),
    (500, "tensorrt_llm: the CPU runtime failed: RuntimeError('runtime_top_k')",
     (500, "server_error", None, "tensorrt_llm: the CPU runtime failed: RuntimeError('runtime_top_k')")),
], ids=["tensor", "first field named", "frontend refusal", "no OpenAI field", "internal"])
def test_a_refusal_names_the_first_openai_field_its_sentence_names(
        status: int, message: str, expected: tuple[int, str, str | None, str]) -> None:
    error = generation_failure(GenerationError(message, status=status))
    assert (error.status, error.kind, error.param, str(error)) == expected


class RefusesTheSecond:
    """Answers prompt "x" with "a" then "b"; refuses prompt "y" as the CPU runtime refuses len_penalty, once "x"'s
    first chunk is out (so the stream has begun)."""

    def __init__(self) -> None:
        self.first_out = asyncio.Event()

    async def stream(self, gen: GenerationRequest) -> AsyncGenerator[GenerationResponse, None]:
        if gen.prompt == "y":
            await self.first_out.wait()
            raise GenerationError(REFUSED.replace("length_penalty", "len_penalty"), status=400)
        for i, text in enumerate(("a", "b")):
            yield GenerationResponse(texts=(text,), num_input_tokens=1, num_output_tokens=i + 1)
            self.first_out.set()  # the frontend took the chunk before asking for the next

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def test_a_refusal_after_the_stream_began_is_an_error_event_naming_the_field() -> None:
    frontend = OpenAIFrontend(OpenAIConfig(grpc_url=f"127.0.0.1:{free_port()}", served_name="m"))
    body = {"model": "m", "prompt": ["x", "y"], "max_tokens": 2, "stream": True, "length_penalty": 2.0}

    def post(port: int) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    async def main() -> tuple[int, bytes]:
        port = free_port()
        runner = await start_frontend(frontend, "127.0.0.1", port)
        frontend.table.routes["m"].client = RefusesTheSecond()  # type: ignore[assignment]
        try:
            return await asyncio.wait_for(asyncio.to_thread(post, port), timeout=60)
        finally:
            await runner.cleanup()

    status, raw = asyncio.run(main())
    events = [line[len("data: "):] for line in raw.decode().split("\n\n") if line]
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[0])["choices"][0]["text"] == "a"
    assert json.loads(events[-2]) == {"error": {"message": REFUSED, "type": "invalid_request_error",
                                                "param": "length_penalty", "code": None}}
