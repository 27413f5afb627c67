"""The llmapi request codec: every field round-trips through the tensors; a bad tensor is refused naming it; what
the dialect cannot carry is refused or left out by its row."""

from __future__ import annotations

import numpy as np
import pytest

from tests.wire.values import VALUES
from trtllm_kit.wire import DisaggHandle, GenerationRequest, LoraAdapter, WireError
from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.llmapi import decode_llmapi_request, encode_llmapi_request, request_tensors, speaks_llmapi
from trtllm_kit.wire.request import NEVER_END_ID
from trtllm_kit.wire.tensor import grpc_datatype

PROMPT = (1, 5, 9, 2)
LLMAPI_SCALARS = [r for r in rows(GenerationRequest) if r.is_scalar and r.tensor("llmapi")]
DECLARED = {t.name: t.data_type for t in request_tensors()}


def round_trip(req: GenerationRequest) -> GenerationRequest:
    return decode_llmapi_request(encode_llmapi_request(req))


@pytest.mark.parametrize("row", LLMAPI_SCALARS, ids=lambda r: r.name)
def test_each_scalar_field_round_trips(row) -> None:
    req = GenerationRequest(PROMPT, **{row.name: VALUES[row.name]})
    arrays = encode_llmapi_request(req)
    assert grpc_datatype(arrays[row.tensor("llmapi")]) == DECLARED[row.tensor("llmapi")]
    assert round_trip(req) == req


def test_the_structured_fields_round_trip() -> None:
    handle = DisaggHandle(request_type="generation_only", first_gen_tokens=(4,), ctx_request_id=3,
                          opaque_state=b"\x01state")
    req = GenerationRequest("Hello there", 5, end_id=NEVER_END_ID, logprobs=2, prompt_logprobs=0,
                            stop_strings=("\n", "END"), guide=("choice", '["a", "b"]'), lora=LoraAdapter("sql"),
                            disaggregated=handle)
    arrays = encode_llmapi_request(req)
    assert "sampling_param_end_id" not in arrays and arrays["sampling_param_ignore_eos"].tolist() == [True]
    assert arrays["sampling_param_stop"].tolist() == [b"\n", b"END"]
    assert round_trip(req) == req
    assert round_trip(GenerationRequest(PROMPT, max_tokens=None)).max_tokens is None  # the LLM API's default


def test_a_model_without_an_input_gets_strict_fields_refused_and_the_others_left_out() -> None:
    older = {n: t for n, t in DECLARED.items() if n not in ("priority", "keep_end_token", "sampling_param_min_p",
                                                             "sampling_param_include_stop_str_in_output")}
    sent = encode_llmapi_request(GenerationRequest(PROMPT, priority=0.5, keep_end_token=True,
                                                   stop_strings=("x",)), older)
    assert not {"priority", "keep_end_token", "sampling_param_stop"} & set(sent)
    with pytest.raises(WireError, match=r"^min_p is not served by this model: it declares no sampling_param_min_p "
                                        r"input; leave min_p out, or rebuild the repository\.$"):
        encode_llmapi_request(GenerationRequest(PROMPT, min_p=0.5), older)
    with pytest.raises(WireError, match=r"^disaggregated is not served by this model: it declares no "
                                        r"disaggregated_params input"):
        encode_llmapi_request(GenerationRequest(PROMPT, disaggregated=DisaggHandle(request_type="context_only")),
                              {n: t for n, t in DECLARED.items() if n != "disaggregated_params"})
    assert speaks_llmapi(DECLARED) and not speaks_llmapi({"input_ids": "INT32"})


@pytest.mark.parametrize(("values", "message"), [
    ({"beam_width": 2}, "beam_width cannot be sent to the llmapi model, which has no input for it; leave beam_width "
                        "out, or serve a model that takes it."),
    ({"return_context_logits": True}, None),  # not strict: left out
    ({"stop_words": ((3,),)}, None),  # the stop strings say the same to an llmapi model
    ({"lora": LoraAdapter(task_id=5)}, "lora_name is not set: the llmapi model names an adapter by name, and the "
                                       "request has only task id 5; send the adapter's name."),
])
def test_what_the_llmapi_model_cannot_carry(values: dict, message: str | None) -> None:
    req = GenerationRequest(PROMPT, **values)
    if message is None:
        assert set(encode_llmapi_request(req)) == set(encode_llmapi_request(GenerationRequest(PROMPT)))
        return
    with pytest.raises(WireError) as caught:
        encode_llmapi_request(req)
    assert str(caught.value) == message


@pytest.mark.parametrize(("arrays", "message"), [
    ({"sampling_param_max_tokens": np.array([4])}, "text_input and input_ids are both missing; send text_input (a "
                                                   "prompt) or input_ids (token ids)."),
    ({"text_input": np.array([b"hi"], object), "sampling_param_top_p": np.array([1.5], np.float32)},
     "sampling_param_top_p must be a number in [0, 1], got 1.5; send one that is, or leave sampling_param_top_p out."),
    ({"text_input": np.array([b"hi"], object), "sampling_param_logprobs": np.array([30], np.int32)},
     "sampling_param_logprobs must be an integer from 0 to 20, got 30; send one that is, or leave "
     "sampling_param_logprobs out."),
    ({"text_input": np.array([b"hi"], object), "sampling_param_n": np.array([3]), "sampling_param_best_of":
      np.array([2])}, "sampling_param_best_of must be an integer >= n (3), got 2; send one that is, or leave "
                      "sampling_param_best_of out."),
    ({"text_input": np.array([b"\xc3("], object)}, "text_input is not UTF-8 text (byte 0xc3 at offset 0); send "
                                                    "UTF-8."),
    ({"text_input": np.array([b""], object)}, "text_input is empty; send a prompt of at least one character or token "
                                               "id."),
    ({"input_ids": np.array([], np.int32)}, "input_ids is empty; send a prompt of at least one character or token "
                                            "id."),
    ({"input_ids": np.array([3]), "disaggregated_params": np.array([b'{"request_type": "later"}'], object)},
     "disaggregated_params.request_type must be one of context_only, generation_only, context_and_generation, got "
     "'later'; send the handle a context-only response returned."),
])
def test_a_bad_tensor_is_refused_naming_it(arrays: dict, message: str) -> None:
    with pytest.raises(WireError) as caught:
        decode_llmapi_request(arrays)
    assert str(caught.value) == message
