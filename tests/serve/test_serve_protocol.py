"""OpenAI request fields: validation messages and their meaning in TensorRT-LLM's sampling terms."""

from __future__ import annotations

import pytest

from trtllm_kit.serve.client import GenerationRequest
from trtllm_kit.serve.openai_protocol import RequestError, generation_request, parse_sampling


@pytest.mark.parametrize(("body", "expected"), [
    ({"temperature": 0}, GenerationRequest("p", 16, top_k=1, request_id="r")),  # greedy
    ({}, GenerationRequest("p", 16, 1.0, 1.0, request_id="r")),  # OpenAI's defaults: sample the whole distribution
    ({"temperature": 0.5, "top_p": 0.9, "seed": 3, "max_tokens": 4},
     GenerationRequest("p", 4, 0.5, 0.9, seed=3, request_id="r")),
])
def test_sampling_in_trtllm_terms(body: dict, expected: GenerationRequest) -> None:
    assert generation_request("p", parse_sampling(body, "text_completion"), "r") == expected


def test_chat_default_max_tokens_and_stream_options() -> None:
    sampling = parse_sampling({"stream": True, "stream_options": {"include_usage": True}, "stop": "x"},
                              "chat.completion")
    assert (sampling.max_tokens, sampling.stream, sampling.include_usage, sampling.stops) == (128, True, True, ["x"])
    assert parse_sampling({"max_completion_tokens": 7}, "chat.completion").max_tokens == 7


@pytest.mark.parametrize(("body", "message", "param"), [
    ({"max_tokens": 0}, "max_tokens must be a positive integer, got 0.", "max_tokens"),
    ({"temperature": 3}, "temperature must be between 0 and 2, got 3.", "temperature"),
    ({"top_p": 0}, "top_p must be in (0, 1], got 0.", "top_p"),
    ({"seed": -1}, "seed must be a non-negative integer, got -1.", "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop must be a string or a list of up to 4 strings, got ['a', 'b', 'c', "
                                          "'d', 'e'].", "stop"),
    ({"n": 2}, "n must be 1 here, got 2.", "n"),
])
def test_bad_fields(body: dict, message: str, param: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_sampling(body, "text_completion")
    assert info.value.body() == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                           "code": None}}
    assert info.value.status == 400
