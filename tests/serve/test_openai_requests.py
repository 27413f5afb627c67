"""The typed parse of OpenAI's request bodies: each field parsed once into ``CompletionRequest`` or ``ChatRequest``,
the refusal of a wrong field naming it whichever check caught it, and the request in the wire's terms."""

from __future__ import annotations

import pytest

from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.requests import ChatRequest, CompletionRequest
from trtllm_kit.serve.openai.sampling_fields import EXTRA_ROWS
from trtllm_kit.wire import GenerationRequest, WireError
from trtllm_kit.wire.fields import Row, rows

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_a_completion_is_parsed_into_typed_fields() -> None:
    req = CompletionRequest.parse({"model": "m", "prompt": ["a", [5, 6]], "max_completion_tokens": 9, "max_tokens": 3,
                                   "stop": "x", "n": 2, "best_of": 3, "top_k": -1, "min_p": 0, "logprobs": 1,
                                   "response_format": {"type": "json_object"}}, vocab_size=10)
    assert req.prompts == ["a", (5, 6)] and req.max_tokens == 9  # max_completion_tokens wins, as OpenAI reads it
    assert (req.stops, req.n, req.best_of, req.extras) == (["x"], 2, 3, {"top_k": 0, "min_p": 0.0})
    assert (req.guide, req.guide_field, req.scoring.logprobs) == (("json", ""), "response_format", 1)
    assert CompletionRequest.parse({"prompt": "p", "n": 2, "best_of": 2}).best_of is None  # no more than n: unranked


def test_a_chat_request_keeps_its_messages_for_the_template() -> None:
    req = ChatRequest.parse({**CHAT, "logprobs": True, "top_logprobs": 3, "stream": True,
                             "stream_options": {"continuous_usage_stats": True}})
    assert req.chat_messages == [{"role": "user", "content": "hi"}] and req.max_tokens == 128
    assert (req.scoring.logprobs, req.continuous_usage, req.include_usage) == (3, True, False)


@pytest.mark.parametrize(("cls", "body", "message", "param"), [
    (CompletionRequest, {"prompt": "p", "min_tokens": "x", "max_tokens": 4},
     "min_tokens must be an integer from 0 to max_tokens (4), got 'x'.", "min_tokens"),
    (CompletionRequest, {"prompt": "p", "best_of": 2.0, "n": 2},
     "best_of must be an integer from n (2) to 16, got 2.0.", "best_of"),
    (CompletionRequest, {"prompt": "p", "max_completion_tokens": "many"}, "max_tokens must be a positive integer, got "
     "'many'.", "max_tokens"),
    (CompletionRequest, {"prompt": "p", "stream_options": {"include_usage": True}},
     "stream_options is only allowed when stream is true.", "stream_options"),
    (CompletionRequest, {"prompt": "p", "stream": True, "stream_options": {"usage": True}},
     "stream_options must be an object of include_usage and continuous_usage_stats booleans, got {'usage': True}.",
     "stream_options"),
    (CompletionRequest, {"prompt": "p", "temperature": True}, "temperature must be a number, got True.", "temperature"),
    (CompletionRequest, {"prompt": "p", "echo": None}, "echo must be true or false, got None.", "echo"),
    (CompletionRequest, {"prompt": "p", "foo": 1}, "Unrecognized request argument supplied: foo.", "foo"),
    (CompletionRequest, {"prompt": "p", "messages": []}, "Unrecognized request argument supplied: messages.",
     "messages"),
    (ChatRequest, {"messages": []}, "messages must be a non-empty list of {role, content} objects.", "messages"),
    (ChatRequest, {"messages": [{"content": "hi"}]}, "messages must be a non-empty list of {role, content} objects.",
     "messages"),
    (ChatRequest, {**CHAT, "echo": True}, "Unrecognized request argument supplied: echo.", "echo"),
    (ChatRequest, {**CHAT, "max_tokens": 300}, "max_tokens must be at most 199 (this model's max_seq_len is 200 "
     "tokens), got 300.", "max_tokens"),
])
def test_refusals_name_the_field(cls: type[CompletionRequest | ChatRequest], body: dict, message: str,
                                 param: str) -> None:
    with pytest.raises(HTTPError) as info:
        cls.parse(body, max_seq_len=200)
    assert (str(info.value), info.value.param, info.value.status) == (message, param, 400)


def test_to_generation_is_the_wire_record_with_what_the_route_adds() -> None:
    req = CompletionRequest.parse({"prompt": "p", "temperature": 0, "top_k": 5, "min_p": 0.1, "priority": 100,
                                   "logprobs": 2, "echo": True, "stop": ["ab"], "seed": 4})
    gen = req.to_generation((1, 2), "r", eos_id=2, stop_words=((7, 8),), context_logits=True, seed=9, n=2)
    assert gen == GenerationRequest((1, 2), 16, request_id="r", top_k=1, min_p=0.1, seed=9, end_id=2, priority=0.0,
                                    logprobs=2, prompt_logprobs=2, stop_words=((7, 8),), stop_strings=("ab",),
                                    return_context_logits=True, keep_end_token=True, n=2)


def test_a_value_only_the_wire_refuses_is_a_400_naming_it() -> None:
    req = CompletionRequest.parse({"prompt": "p", "seed": 2**64 - 1})
    with pytest.raises(HTTPError) as info:
        req.to_generation("p", "r", best_of=1, n=2)
    assert info.value.param == "best_of" and info.value.status == 400


def test_every_field_a_wire_row_names_in_an_openai_body_is_parsed() -> None:
    carried = {row.openai for row in rows(GenerationRequest) if row.openai is not None}
    assert carried <= set(CompletionRequest.model_fields) and carried <= set(ChatRequest.model_fields)


@pytest.mark.parametrize("row", EXTRA_ROWS, ids=lambda row: row.name)
def test_a_sampling_extra_reaches_its_wire_field_and_is_refused_in_its_rows_sentence(row: Row) -> None:
    req = CompletionRequest.parse({"prompt": "p", str(row.openai): 1})
    assert getattr(req.to_generation("p", "r"), row.name) == 1
    assert row.rule is not None
    with pytest.raises(WireError) as wire:
        row.rule.checked(row.name, "x")
    with pytest.raises(HTTPError) as info:
        CompletionRequest.parse({"prompt": "p", str(row.openai): "x"})
    assert (str(info.value), info.value.param) == (str(wire.value), row.openai)
