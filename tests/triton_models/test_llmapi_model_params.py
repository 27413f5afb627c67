"""The llmapi model's LLM API arguments, without Triton: a wire request's SamplingParams keywords by upstream's
name rule, the checks the LLM API leaves to its caller, guides, and which errors are the client's."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from trtllm_kit.llmapi.cpu_types import GuidedDecodingParams, SamplingParams
from trtllm_kit.runtime.sampling_rules import MIN_TEMPERATURE
from trtllm_kit.triton_models.llmapi_params import (
    SAMPLING_FIELDS,
    check_mode,
    check_sampling,
    guided_decoding,
    is_client_error,
    sampling_kwargs,
    sampling_params,
)
from trtllm_kit.wire import GenerationRequest, WireError
from trtllm_kit.wire.llmapi import decode_llmapi_request, encode_llmapi_request
from trtllm_kit.wire.request import NEVER_END_ID


def test_every_sampling_tensor_names_a_field_of_the_llm_apis_sampling_params() -> None:
    taken = set(inspect.signature(SamplingParams).parameters)
    assert set(SAMPLING_FIELDS.values()) <= taken
    assert {"stop", "exclude_input_from_output", "max_tokens"} <= set(SAMPLING_FIELDS.values())
    assert not {"streaming", "priority", "keep_end_token", "return_finish_reason"} & set(SAMPLING_FIELDS)


def test_the_keywords_are_the_fields_the_request_sets() -> None:
    req = decode_llmapi_request(encode_llmapi_request(GenerationRequest(
        (1, 2), 8, seed=5, top_k=3, temperature=0.5, stop_strings=("a", "b"), exclude_input_in_output=False,
        include_stop_str_in_output=True)))
    assert sampling_kwargs(req) == {"max_tokens": 8, "seed": 5, "top_k": 3, "temperature": 0.5, "stop": ["a", "b"],
                                    "exclude_input_from_output": False, "include_stop_str_in_output": True}
    assert SamplingParams(**sampling_kwargs(req)).stop == ["a", "b"]


def test_no_end_token_is_ignore_eos() -> None:
    kwargs = sampling_kwargs(GenerationRequest((1,), 4, end_id=NEVER_END_ID))
    assert kwargs == {"max_tokens": 4, "ignore_eos": True}
    assert sampling_kwargs(GenerationRequest((1,), 4, end_id=7)) == {"max_tokens": 4, "end_id": 7}
    arrays = {"input_ids": np.array([1], np.int32), "sampling_param_ignore_eos": np.array([True])}
    assert sampling_kwargs(decode_llmapi_request(arrays)) == {"ignore_eos": True}


def test_a_temperature_too_small_to_divide_by_is_greedy() -> None:
    below = {"temperature": MIN_TEMPERATURE / 2, "top_p": 0.5}
    check_sampling(below)
    assert below == {"top_k": 1}
    at = {"temperature": MIN_TEMPERATURE, "top_p": 0.5}
    check_sampling(at)
    assert at == {"temperature": MIN_TEMPERATURE, "top_p": 0.5}


def test_a_top_p_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^top_p must be in \(0, 1\], got 0\.0$"):
        sampling_kwargs(GenerationRequest((1,), 4, top_p=0.0))


@pytest.mark.parametrize(("req", "decoupled", "message"), [
    (GenerationRequest((1,), 4, streaming=True), False, "Streaming is only supported in decoupled mode."),
    (GenerationRequest((1,), 4, n=2), False, "sampling_param_n > 1 needs decoupled mode"),
    (GenerationRequest((1,), 4, n=2, best_of=3, streaming=True), True, "best_of greater than n cannot be streamed"),
])
def test_what_the_transaction_policy_cannot_answer_is_refused(req, decoupled: bool, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_mode(req, decoupled)
    check_mode(GenerationRequest((1,), 4, n=2, best_of=3), True)


def test_guides_become_guided_decoding_params() -> None:
    assert guided_decoding(None, GuidedDecodingParams) is None
    assert guided_decoding(("json", ""), GuidedDecodingParams) == GuidedDecodingParams(json_object=True)
    assert guided_decoding(("regex", "a+"), GuidedDecodingParams) == GuidedDecodingParams(regex="a+")
    assert guided_decoding(("choice", '["yes", "n\\"o"]'), GuidedDecodingParams) == GuidedDecodingParams(
        grammar='root ::= "yes" | "n\\"o"')
    with pytest.raises(ValueError, match="a choice guide must be a JSON array of strings, got 'yes'"):
        guided_decoding(("choice", "yes"), GuidedDecodingParams)


def test_refusals_of_the_request_are_the_clients() -> None:
    assert is_client_error(ValueError("x")) and is_client_error(WireError("top_k", "x"))
    assert not is_client_error(RuntimeError("x")) and not is_client_error(KeyError("x"))


def test_keep_end_token_goes_only_to_a_class_that_has_it() -> None:
    req = GenerationRequest((1,), 4, keep_end_token=True, guide=("regex", "a+"))
    params = sampling_params(req, SamplingParams, GuidedDecodingParams)
    assert params.keep_end_token and params.guided_decoding == GuidedDecodingParams(regex="a+")

    def upstream_like(max_tokens: int = 32, guided_decoding: object = None) -> dict:  # no keep_end_token field
        return {"max_tokens": max_tokens, "guided_decoding": guided_decoding}

    assert sampling_params(req, upstream_like, GuidedDecodingParams) == {
        "max_tokens": 4, "guided_decoding": GuidedDecodingParams(regex="a+")}
