"""OpenAI request fields: validation messages and their meaning in TensorRT-LLM's sampling terms."""

from __future__ import annotations

import pytest

from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.guided import parse_guide
from trtllm_kit.serve.openai.logprobs import Scoring
from trtllm_kit.serve.openai.requests import ChatRequest, CompletionRequest
from trtllm_kit.serve.openai.responses import ChoiceShape
from trtllm_kit.serve.openai.sampling_fields import OpenAIRequest
from trtllm_kit.wire import GenerationRequest

PROMPTS = {"text_completion": {"prompt": "p"}, "chat.completion": {"messages": [{"role": "user", "content": "hi"}]}}


def parse(body: dict, kind: str = "text_completion") -> OpenAIRequest:
    """A request of ``kind`` with ``body``'s fields (and a prompt or messages when it has none)."""
    cls = CompletionRequest if kind == "text_completion" else ChatRequest
    return cls.parse({**PROMPTS[kind], **body})


@pytest.mark.parametrize(("body", "expected"), [
    ({"temperature": 0}, GenerationRequest("p", 16, top_k=1, request_id="r")),  # greedy
    ({"temperature": 1e-45}, GenerationRequest("p", 16, top_k=1, request_id="r")),  # below 1e-5: greedy
    ({"temperature": 0.99e-5, "top_p": 0.5}, GenerationRequest("p", 16, top_k=1, request_id="r")),
    ({"temperature": 1e-5},  # the smallest sampled
     GenerationRequest("p", 16, temperature=1e-5, top_p=1.0, request_id="r")),
    ({"temperature": 2, "top_p": 1e-30, "seed": 2**64 - 1},
     GenerationRequest("p", 16, temperature=2.0, top_p=1e-30, seed=2**64 - 1, request_id="r")),
    ({},  # OpenAI's defaults: sample the whole distribution
     GenerationRequest("p", 16, temperature=1.0, top_p=1.0, request_id="r")),
    ({"temperature": 0.5, "top_p": 0.9, "seed": 3, "max_tokens": 4},
     GenerationRequest("p", 4, temperature=0.5, top_p=0.9, seed=3, request_id="r")),
    ({"temperature": 0, "max_tokens": 9, "min_tokens": 9, "ignore_eos": True},  # a forced output length
     GenerationRequest("p", 9, top_k=1, min_tokens=9, end_id=-1, request_id="r")),
])
def test_sampling_in_trtllm_terms(body: dict, expected: GenerationRequest) -> None:
    assert parse(body).to_generation("p", "r") == expected


def test_token_id_prompts_carry_the_end_id_unless_eos_is_ignored() -> None:
    assert parse({"temperature": 0}).to_generation((5, 6), "r", eos_id=2).end_id == 2
    assert parse({"temperature": 0, "ignore_eos": True}).to_generation((5, 6), "r", eos_id=2).end_id == -1


@pytest.mark.parametrize(("prompt", "expected"), [
    ("hi", ["hi"]), (["hi"], ["hi"]), ([5, 6, 7], [(5, 6, 7)]), ([[5, 6]], [(5, 6)]),
    (["a", [5], "b"], ["a", (5,), "b"]), ([[1]] * 64, [(1,)] * 64),
])
def test_prompts_as_text_or_token_ids(prompt: object, expected: object) -> None:
    assert CompletionRequest.parse({"prompt": prompt}, vocab_size=100).prompts == expected


@pytest.mark.parametrize(("prompt", "message"), [
    ([5, 100], "token ids must be in [0, 100) (the tokenizer's vocabulary), got 100."),
    ([-1], "token ids must be in [0, 100) (the tokenizer's vocabulary), got -1."),
    ([], "prompt must be a string or a list of token ids (or a list of them), got []."),
    (["a"] * 65, "prompt is a list of 65 prompts; at most 64 are allowed per request: split it."),
    (["a", [-1]], "token ids must be in [0, 100) (the tokenizer's vocabulary), got -1."),
    ([True], "prompt must be a string or a list of token ids (or a list of them), got [True]."),
])
def test_bad_prompts(prompt: object, message: str) -> None:
    with pytest.raises(HTTPError) as info:
        CompletionRequest.parse({"prompt": prompt}, vocab_size=100)
    assert str(info.value) == message and info.value.param == "prompt"


def test_stream_chunks_carry_token_ids_when_known() -> None:
    shape = ChoiceShape("text_completion", "cmpl-1", "m", 0)
    assert shape.chunk("a", None, (4, 5))["choices"][0]["token_ids"] == [4, 5]
    assert "token_ids" not in shape.chunk("a", None)["choices"][0]


def test_chat_default_max_tokens_and_stream_options() -> None:
    sampling = parse({"stream": True, "stream_options": {"include_usage": True}, "stop": "x"}, "chat.completion")
    assert (sampling.max_tokens, sampling.stream, sampling.include_usage, sampling.stops) == (128, True, True, ["x"])
    assert parse({"max_completion_tokens": 7}, "chat.completion").max_tokens == 7


@pytest.mark.parametrize(("body", "message", "param"), [
    ({"max_tokens": 0}, "max_tokens must be a positive integer, got 0.", "max_tokens"),
    ({"temperature": 3}, "temperature must be between 0 and 2, got 3.", "temperature"),
    ({"top_p": 0}, "top_p must be in (0, 1], got 0.", "top_p"),
    ({"top_p": 1e-45 - 1e-45}, "top_p must be in (0, 1], got 0.0.", "top_p"),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5.", "top_p"),
    ({"temperature": "hot"}, "temperature must be a number, got 'hot'.", "temperature"),
    ({"seed": -1}, "seed must be an integer from 0 to 2**64 - 1, got -1.", "seed"),
    ({"seed": 2**64}, "seed must be an integer from 0 to 2**64 - 1, got 18446744073709551616.", "seed"),
    ({"stop": ["a"] * 65}, "stop holds 65 sequences; at most 64 are allowed.", "stop"),
    ({"stop": "x" * 1001}, "a stop sequence has 1001 characters; at most 1000 are allowed in each "
                           "('xxxxxxxxxxxxxxxxxxxx'...).", "stop"),
    ({"stop": ["y" * 1000] * 17}, "the stop sequences have 17000 characters together; at most 16384 are allowed.",
     "stop"),
    ({"stop": ["a", 5]}, "stop must be a string or a list of up to 64 strings, got ['a', 5].", "stop"),
    ({"n": 17}, "n must be an integer from 1 to 16, got 17.", "n"),
    ({"n": True}, "n must be an integer from 1 to 16, got True.", "n"),
    ({"n": 2, "best_of": 1}, "best_of must be an integer from n (2) to 16, got 1.", "best_of"),
    ({"best_of": 17}, "best_of must be an integer from n (1) to 16, got 17.", "best_of"),
    ({"n": 2, "best_of": 3, "stream": True}, "best_of (3) greater than n (2) cannot be streamed: the best are known "
                                             "only once all are done; send stream false, or best_of equal to n.",
     "best_of"),
    ({"max_tokens": 4, "min_tokens": 5}, "min_tokens must be an integer from 0 to max_tokens (4), got 5.",
     "min_tokens"),
    ({"ignore_eos": "yes"}, "ignore_eos must be true or false, got 'yes'.", "ignore_eos"),
    ({"min_p": 1.5}, "min_p must be a number in [0, 1], got 1.5; send one that is, or leave min_p out.", "min_p"),
    ({"top_k": -2}, "top_k must be an integer from 0 to 2**31 - 1, got -2; send one that is, or leave top_k out.",
     "top_k"),
    ({"top_k": 2.5}, "top_k must be an integer from 0 to 2**31 - 1, got 2.5; send one that is, or leave top_k out.",
     "top_k"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a number greater than 0, got 0.0; send one that is, or "
                                "leave repetition_penalty out.", "repetition_penalty"),
    ({"presence_penalty": 3}, "presence_penalty must be a number in [-2, 2], got 3.0; send one that is, or leave "
                              "presence_penalty out.", "presence_penalty"),
    ({"frequency_penalty": "x"}, "frequency_penalty must be a number in [-2, 2], got 'x'; send one that is, or leave "
                                 "frequency_penalty out.", "frequency_penalty"),
    ({"skip_special_tokens": None}, "skip_special_tokens must be true or false, got None.", "skip_special_tokens"),
    ({"echo": True, "max_tokens": -1}, "max_tokens must be a positive integer, got -1.", "max_tokens"),
    ({"include_stop_str_in_output": 1}, "include_stop_str_in_output must be true or false, got 1.",
     "include_stop_str_in_output"),
])
def test_bad_fields(body: dict, message: str, param: str) -> None:
    with pytest.raises(HTTPError) as info:
        parse(body)
    assert info.value.body() == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                           "code": None}}
    assert info.value.status == 400


@pytest.mark.parametrize(("body", "kind", "message", "param"), [
    ({"logprobs": 6}, "text_completion", "logprobs must be an integer from 0 to 5, got 6.", "logprobs"),
    ({"logprobs": True}, "text_completion", "logprobs must be an integer from 0 to 5, got True.", "logprobs"),
    ({"echo": 1}, "text_completion", "echo must be true or false, got 1.", "echo"),
    ({"logprobs": 1}, "chat.completion", "logprobs must be true or false, got 1.", "logprobs"),
    ({"top_logprobs": 2}, "chat.completion", "top_logprobs needs logprobs set to true.", "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "chat.completion", "top_logprobs must be an integer from 0 to 20, got 21.",
     "top_logprobs"),
])
def test_bad_logprob_fields(body: dict, kind: str, message: str, param: str) -> None:
    with pytest.raises(HTTPError) as info:
        parse(body, kind)
    assert (str(info.value), info.value.param) == (message, param)


def test_logprob_fields_parse() -> None:
    assert parse({"logprobs": 0, "echo": True}).scoring == Scoring(0, True)
    assert parse({"logprobs": True}, "chat.completion").scoring == Scoring(0)
    assert parse({}, "chat.completion").scoring == Scoring()
    assert parse({"echo": True, "max_tokens": 0}).max_tokens == 0


@pytest.mark.parametrize(("body", "guide"), [
    ({}, None), ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, ("json", "")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
     ("json_schema", '{"type": "object"}')),
    ({"guided_json": {"type": "object"}}, ("json_schema", '{"type": "object"}')),
    ({"guided_regex": "a+"}, ("regex", "a+")), ({"guided_choice": ["a", "b"]}, ("choice", '["a", "b"]')),
    ({"guided_grammar": 'root ::= "a"'}, ("ebnf_grammar", 'root ::= "a"')),
])
def test_structured_output_fields_as_the_engine_guide(body: dict, guide: tuple[str, str] | None) -> None:
    assert parse_guide(body) == guide


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_schema"}}, "response_format"), ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": "{not json"}, "guided_json"), ({"guided_regex": "a", "guided_grammar": "b"}, "guided_grammar"),
])
def test_bad_structured_output_fields(body: dict, param: str) -> None:
    with pytest.raises(HTTPError) as info:
        parse_guide(body)
    assert info.value.param == param
