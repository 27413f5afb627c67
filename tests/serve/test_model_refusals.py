"""A request the OpenAI parse lets through and a Triton model refuses (INVALID_ARG) reaches the client as a 400
(``invalid_request_error``) carrying the model's sentence, ``param`` naming the OpenAI field the sentence names; the
runtime's own failures stay 500. On the shared served cpu build: the CPU runtime refuses ``length_penalty`` other
than 1.0 (it has no beam search), through the ``openai`` client and raw HTTP, whole and streamed; the kit's gRPC
client gets the status of the model's refusals itself (token ids outside the model's vocabulary, beams)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
import torch
from kit_server import BuildKey, KitServer, Servers

from trtllm_kit.serve.client import TextClient
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.openai.errors import generation_failure
from trtllm_kit.wire import GenerationRequest

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
