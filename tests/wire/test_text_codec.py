"""The text interface's request codec (``ensemble``, ``tensorrt_llm_bls``): each field as its declared input,
inputs a model lacks left out, and what the interface cannot carry refused."""

from __future__ import annotations

import numpy as np
import pytest

from tests.wire.values import VALUES
from trtllm_kit.model_repo import tensors as T
from trtllm_kit.wire import GenerationRequest, LoraAdapter, WireError
from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.tensor import grpc_datatype
from trtllm_kit.wire.text import encode_text_request

TEXT_SCALARS = [r for r in rows(GenerationRequest) if r.is_scalar and r.tensor("text")]


@pytest.mark.parametrize("row", TEXT_SCALARS, ids=lambda r: r.name)
def test_each_scalar_field_goes_as_its_declared_input(row) -> None:
    arrays = encode_text_request(GenerationRequest("Hi", **{row.name: VALUES[row.name]}))
    declared = {t.name: t.data_type for t, _ in T.TEXT_INPUTS}
    name = row.tensor("text")
    assert grpc_datatype(arrays[name]) == declared[name] and arrays[name].tolist() == [VALUES[row.name]]


def test_inputs_the_model_lacks_are_left_out_and_strict_ones_refused() -> None:
    declared = {"text_input": "STRING", "max_tokens": "INT32", "stream": "BOOL"}
    assert set(encode_text_request(GenerationRequest("Hi", temperature=0.5, return_num_input_tokens=True),
                                   declared)) == {"text_input", "max_tokens"}
    with pytest.raises(WireError, match=r"^repetition_penalty is not served by this model: it declares no "
                                        r"repetition_penalty input; leave repetition_penalty out"):
        encode_text_request(GenerationRequest("Hi", repetition_penalty=1.5), declared)
    lora = encode_text_request(GenerationRequest("Hi", lora=LoraAdapter(task_id=3, weights=np.ones((1, 2)),
                                                                        config=np.ones((1, 3)))))
    assert lora["lora_task_id"].tolist() == [3] and lora["lora_weights"].dtype == np.float32


@pytest.mark.parametrize(("values", "message"), [
    ({"prompt": (1, 2)}, "prompt is token ids, and the text interface (ensemble, tensorrt_llm_bls) takes text; send "
                         "the ids to the tensorrt_llm model, or send text."),
    ({"min_p": 0.5}, "min_p cannot be sent to the text interface (ensemble, tensorrt_llm_bls), which has no input for "
                     "it; leave min_p out, or serve a model that takes it."),
    ({"logprobs": 2}, "logprobs cannot be sent to the text interface (ensemble, tensorrt_llm_bls), which has no input "
                      "for it; leave logprobs out, or serve a model that takes it."),
    ({"guide": ("json", "")}, "guide cannot be sent to the text interface (ensemble, tensorrt_llm_bls), which has no "
                              "input for it; leave guide out, or serve a model that takes it."),
    ({"n": 1, "best_of": 2}, "best_of cannot be sent to the text interface (ensemble, tensorrt_llm_bls), which has no "
                             "input for it; leave best_of out, or serve a model that takes it."),
    ({"max_tokens": None}, "max_tokens is required by the text interface; send it."),
])
def test_what_the_text_interface_cannot_carry_is_refused(values: dict, message: str) -> None:
    with pytest.raises(WireError) as caught:
        encode_text_request(GenerationRequest(**{"prompt": "Hi", **values}))
    assert str(caught.value) == message
