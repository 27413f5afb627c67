"""The OpenAI completion body of a request: every row of the wire goes under its OpenAI name, or not at all; the
end id that never ends is ``ignore_eos``; a guide is vLLM's ``guided_*`` field; a streamed body asks for the usage."""

from __future__ import annotations

from typing import Any

import pytest

from tests.wire.values import VALUES
from trtllm_kit.wire import DisaggHandle, GenerationRequest, LoraAdapter
from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.openai_body import encode_openai_body
from trtllm_kit.wire.request import NEVER_END_ID

PROMPT = (1, 5, 9, 2)
BASE = {"model": "m", "prompt": [1, 5, 9, 2], "stream": False}
OPENAI_NAMES = {
    "max_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "seed": "seed", "min_tokens": "min_tokens", "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "stop_strings": "stop",
    "include_stop_str_in_output": "include_stop_str_in_output", "length_penalty": "length_penalty"}
STRUCTURED = {  # a value of every structured field, and what the body carries of it beyond BASE
    "request_id": ("r-1", {}), "logprobs": (2, {}), "prompt_logprobs": (1, {}), "stop_words": (((3, 4),), {}),
    "stop_strings": (("\n", "END"), {"stop": ["\n", "END"]}), "guide": (("regex", "[ab]+"), {"guided_regex": "[ab]+"}),
    "draft_ids": ((6, 7), {}), "lora": (LoraAdapter("sql"), {}),
    "disaggregated": (DisaggHandle(request_type="context_only"), {})}


def test_the_rows_name_their_openai_field() -> None:
    assert {row.name: row.openai for row in rows(GenerationRequest) if row.openai is not None} == OPENAI_NAMES


@pytest.mark.parametrize("row", [r for r in rows(GenerationRequest) if r.name != "prompt"], ids=lambda r: r.name)
def test_each_field_goes_under_its_openai_name_or_not_at_all(row: Any) -> None:
    if row.is_scalar:
        value = VALUES[row.name]
        carried = {} if row.openai is None else {row.openai: value}
    else:
        value, carried = STRUCTURED[row.name]
    fields = {"max_tokens": None, row.name: value}  # max_tokens alone, unless it is the row
    assert encode_openai_body(GenerationRequest(PROMPT, **fields), "m", stream=False) == {**BASE, **carried}


def test_a_text_prompt_goes_as_text_and_a_streamed_body_asks_for_the_usage() -> None:
    body = encode_openai_body(GenerationRequest("Hi", 3), "m", stream=True)
    assert body == {"model": "m", "prompt": "Hi", "stream": True, "max_tokens": 3,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def test_the_end_id_that_never_ends_is_ignore_eos() -> None:
    assert encode_openai_body(GenerationRequest(PROMPT, None, end_id=NEVER_END_ID), "m", stream=False) == {
        **BASE, "ignore_eos": True}


@pytest.mark.parametrize("guide, carried", [
    (("json", ""), {"guided_json": {"type": "object"}}),
    (("json_schema", '{"type": "integer"}'), {"guided_json": {"type": "integer"}}),
    (("choice", '["yes", "no"]'), {"guided_choice": ["yes", "no"]}),
    (("regex", "[0-9]+"), {"guided_regex": "[0-9]+"}),
    (("ebnf_grammar", 'root ::= "a"'), {"guided_grammar": 'root ::= "a"'})])
def test_a_guide_is_its_guided_field(guide: tuple[str, str], carried: dict[str, Any]) -> None:
    assert encode_openai_body(GenerationRequest(PROMPT, None, guide=guide), "m", stream=False) == {**BASE, **carried}


def test_skipped_fields_are_not_sent() -> None:
    req = GenerationRequest(PROMPT, 4, stop_strings=("\n",), include_stop_str_in_output=True, end_id=NEVER_END_ID,
                            guide=("regex", "a"), top_k=2)
    skip = ("stop_strings", "include_stop_str_in_output", "end_id", "guide")
    assert encode_openai_body(req, "m", stream=False, skip=skip) == {**BASE, "max_tokens": 4, "top_k": 2}
