"""The ``tensorrt_llm`` request codec: every field round-trips through the tensors (with and without the batch
dimension); a bad tensor is refused naming it; a model that lacks an input gets a strict field refused and the
others left out."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.wire.values import VALUES, batched
from trtllm_kit.wire import DisaggHandle, GenerationRequest, LoraAdapter, WireError
from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.tensor import is_stop_request
from trtllm_kit.wire.trtllm import decode_trtllm_request, encode_trtllm_request, request_tensors, word_list, words_of

PROMPT = (1, 5, 9, 2)
TRTLLM_SCALARS = [r for r in rows(GenerationRequest) if r.is_scalar and r.tensor("trtllm")]


def round_trip(req: GenerationRequest, batch: bool = False) -> GenerationRequest:
    arrays = encode_trtllm_request(req)
    return decode_trtllm_request(batched(arrays) if batch else arrays)


@pytest.mark.parametrize("row", TRTLLM_SCALARS, ids=lambda r: r.name)
def test_each_scalar_field_round_trips(row) -> None:
    req = GenerationRequest(PROMPT, **{row.name: VALUES[row.name]})
    arrays = encode_trtllm_request(req)
    assert arrays[row.tensor("trtllm")].dtype == np.dtype({"FP32": np.float32, "INT32": np.int32,
                                                           "UINT64": np.uint64, "BOOL": np.bool_}[row.wire.dtype])
    assert decode_trtllm_request(arrays) == req == round_trip(req, batch=True)


def test_the_structured_fields_round_trip() -> None:
    weights, config = np.arange(12, dtype=np.float32).reshape(3, 4) / 8, np.arange(9).reshape(3, 3)
    req = GenerationRequest(PROMPT, 5, logprobs=2, prompt_logprobs=2, stop_words=((7, 8), (9,)),
                            guide=("json_schema", '{"type": "object"}'), lora=LoraAdapter(task_id=11, weights=weights,
                                                                                         config=config))
    assert round_trip(req) == req == round_trip(req, batch=True)
    assert round_trip(replace(req, lora=LoraAdapter(task_id=11))).lora == LoraAdapter(task_id=11)


def test_what_the_dialect_cannot_say_comes_back_as_the_engine_runs_it() -> None:
    """tensorrt_llm has no best_of (num_return_sequences carries it, ranked by the caller) and one alternative
    count for both logprobs; prompt logprobs asked with context logits are the caller's to compute."""
    folded = round_trip(GenerationRequest(PROMPT, n=2, best_of=4))
    assert (folded.n, folded.best_of, folded.logprobs) == (4, None, 0)
    shared = round_trip(GenerationRequest(PROMPT, logprobs=1, prompt_logprobs=3))
    assert (shared.logprobs, shared.prompt_logprobs) == (3, 3)
    by_logits = round_trip(GenerationRequest(PROMPT, prompt_logprobs=2, return_context_logits=True))
    assert (by_logits.prompt_logprobs, by_logits.return_context_logits) == (None, True)
    assert round_trip(GenerationRequest(PROMPT, stop_strings=("x",))).stop_strings == ()  # the frontend cuts them


@pytest.mark.parametrize(("arrays", "message"), [
    ({"input_ids": np.array([1, 2]), "request_output_len": np.array([4]), "runtime_min_p": np.array([1.5])},
     "runtime_min_p must be a number in [0, 1], got 1.5; send one that is, or leave runtime_min_p out."),
    ({"input_ids": np.array([1, 2]), "request_output_len": np.array([0])},
     "request_output_len must be an integer from 1 to 2**31 - 1, got 0; send one that is, or leave request_output_len "
     "out."),
    ({"input_ids": np.array([1, 2]), "input_lengths": np.array([3]), "request_output_len": np.array([4])},
     "input_lengths must be an integer from 1 to 2 (the ids in input_ids), got 3; send one that is, or leave "
     "input_lengths out."),
    ({"input_ids": np.array([1, 2]), "request_output_len": np.array([4]), "min_tokens": np.array([5])},
     "min_tokens must be an integer from 0 to max_tokens (4), got 5; send one that is, or leave min_tokens out."),
    ({"input_ids": np.array([], np.int32), "request_output_len": np.array([4])},
     "input_ids is missing or empty; send the prompt's token ids."),
    ({"input_ids": np.array([1]), "request_output_len": np.array([4]), "temperature": np.array([0.5, 0.5])},
     "temperature must hold one value, got 2; send a tensor of shape [1]."),
    ({"input_ids": np.array([1])}, "request_output_len is missing; send how many tokens to generate."),
    ({"input_ids": np.array([1]), "request_output_len": np.array([4]), "stop_words_list": np.array([[1, 2], [3, -1]])},
     "stop_words_list's end offsets [3] must rise and stay within its 2 ids; send upstream's word list."),
    ({"input_ids": np.array([1]), "request_output_len": np.array([4]), "num_top_log_probs": np.array([21]),
      "return_log_probs": np.array([True])},
     "num_top_log_probs must be an integer from 0 to 20, got 21; send one that is, or leave num_top_log_probs out."),
    ({"input_ids": np.array([1]), "request_output_len": np.array([4]),
      "guided_decoding_guide_type": np.array([b"\xffjson"], object)},
     "guided_decoding_guide_type is not UTF-8 text (byte 0xff at offset 0); send UTF-8."),
    ({"input_ids": np.array([1]), "request_output_len": np.array([4]), "lora_weights": np.zeros((1, 2), np.float32),
      "lora_config": np.zeros((1, 3), np.int32)},
     "lora_task_id must be set for LoRA inference with lora_weights; send the adapter's task id with its rows."),
])
def test_a_bad_tensor_is_refused_naming_it(arrays: dict, message: str) -> None:
    with pytest.raises(WireError) as caught:
        decode_trtllm_request(batched(arrays))
    assert str(caught.value) == message


def test_bfloat16_and_float16_rows_travel_in_the_models_type() -> None:
    weights = np.array([[0.5, -1.25, 3.0, 1 / 3]], np.float32)
    lora = LoraAdapter(task_id=4, weights=weights, config=np.array([[1, 2, 3]]))
    for datatype, dtype in (("BF16", np.uint16), ("FP16", np.float16), ("FP32", np.float32)):
        declared = {t.name: t.data_type for t in request_tensors(datatype)}
        arrays = encode_trtllm_request(GenerationRequest(PROMPT, lora=lora), declared)
        assert arrays["lora_weights"].dtype == dtype and arrays["lora_config"].dtype == np.int32
        back = decode_trtllm_request(arrays).lora
        assert back is not None and back.task_id == 4
        assert np.array_equal(back.weights[0, :3], weights[0, :3])  # exact in every type
        assert abs(back.weights[0, 3] - 1 / 3) < (2e-3 if datatype == "BF16" else 1e-3)
    assert encode_trtllm_request(GenerationRequest(PROMPT, lora=lora), {"lora_task_id": "UINT64", "lora_weights":
                                 "BF16", "lora_config": "INT32"})["lora_weights"].tolist() == [[16128, 49056, 16448,
                                                                                               16043]]


def test_a_model_without_an_input_refuses_a_strict_field_and_leaves_the_others_out() -> None:
    declared = {t.name: t.data_type for t in request_tensors() if t.name not in ("runtime_min_p", "priority")}
    assert "priority" not in encode_trtllm_request(GenerationRequest(PROMPT, priority=0.75), declared)
    with pytest.raises(WireError, match=r"^min_p is not served by this model: it declares no runtime_min_p input; "
                                        r"leave min_p out, or rebuild the repository\.$"):
        encode_trtllm_request(GenerationRequest(PROMPT, min_p=0.25), declared)
    no_lora = {n: t for n, t in declared.items() if not n.startswith("lora_")}
    with pytest.raises(WireError, match=r"^lora is not served by this model: it declares no lora_task_id input"):
        encode_trtllm_request(GenerationRequest(PROMPT, lora=LoraAdapter(task_id=1)), no_lora)


@pytest.mark.parametrize(("values", "message"), [
    ({"prompt": "text"}, "prompt is text, and the tensorrt_llm model takes token ids; tokenize it, or send it to the "
                         "text interface (ensemble, tensorrt_llm_bls) or an llmapi model."),
    ({"max_tokens": None}, "request_output_len is required by the tensorrt_llm model; send max_tokens."),
    ({"disaggregated": DisaggHandle(request_type="context_only")}, "disaggregated cannot be sent to the tensorrt_llm "
     "model, which has no input for it; leave disaggregated out, or serve a model that takes it."),
    ({"lora": LoraAdapter("only-a-name")}, "lora_task_id is not set: this model names an adapter by its task id, and "
                                           "the request names only 'only-a-name'; send the adapter's task id."),
])
def test_what_tensorrt_llm_cannot_carry_is_refused(values: dict, message: str) -> None:
    with pytest.raises(WireError) as caught:
        encode_trtllm_request(GenerationRequest(**{"prompt": PROMPT, **values}))
    assert str(caught.value) == message


def test_word_lists_and_stop_requests() -> None:
    words = ((7, 8), (9,), (4, 5, 6))
    assert words_of(word_list(words)) == words and words_of(word_list(words)[None]) == words
    assert word_list(((1,), (), (2, 3))).tolist() == [[1, 2, 3], [1, 3, -1]]
    assert is_stop_request({"stop": np.array([[True]])}) and not is_stop_request({"stop": np.array([False])})
    assert not is_stop_request({"input_ids": np.array([1])})
