"""The request record: defaults when a field is not sent, and every bad value refused as it is made, in one sentence
naming the field, what it must be, the value found and what to do."""

from __future__ import annotations

import re

import numpy as np
import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.wire import DisaggHandle, GenerationRequest, LoraAdapter, WireError
from trtllm_kit.wire.fields import rows

SCALARS = [r for r in rows(GenerationRequest) if r.is_scalar]
# per rule kind: a value of the wrong type
WRONG_TYPE = {bool: 1, int: 2.5, float: "0.5", str: 3}
SENTENCE = re.compile(r"^\S+ must be .+, got .+; .+\.$")


def test_an_unset_field_is_not_sent_and_runs_at_its_default() -> None:
    req = GenerationRequest((5, 6))
    assert all(getattr(req, r.name) is None for r in SCALARS if r.name != "max_tokens")
    assert (req.setting("temperature"), req.setting("top_p"), req.setting("priority"), req.setting("n")) == (
        1.0, 0.0, 0.5, 1)
    assert req.setting("end_id") is None and req.num_sequences == 1
    assert GenerationRequest((5,), n=2, best_of=4).num_sequences == 4


def test_values_are_held_as_the_field_holds_them() -> None:
    req = GenerationRequest([5, np.int32(6)], temperature=1, seed=np.uint64(7), stop_words=[[1, 2]],
                            stop_strings=["x"], guide=["regex", "a+"])
    assert req.prompt == (5, 6) and req.temperature == 1.0 and isinstance(req.temperature, float)
    assert req.seed == 7 and type(req.seed) is int
    assert (req.stop_words, req.stop_strings, req.guide) == (((1, 2),), ("x",), ("regex", "a+"))


@pytest.mark.parametrize("row", SCALARS, ids=lambda r: r.name)
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(row) -> None:
    value = WRONG_TYPE[row.rule.kind]
    with pytest.raises(WireError) as caught:
        GenerationRequest((1,), **{row.name: value})
    message = str(caught.value)
    assert SENTENCE.match(message) and message.startswith(f"{row.name} must be ") and repr(value) in message
    assert caught.value.field == row.name and isinstance(caught.value, KitUsageError)


@pytest.mark.parametrize("row", [r for r in SCALARS if r.rule.low is not None or r.rule.high is not None],
                         ids=lambda r: r.name)
def test_a_value_out_of_range_is_refused_naming_the_bound(row) -> None:
    rule = row.rule
    value = (rule.high + 1) if rule.high is not None else (rule.low - 1)
    value = float(value) if rule.kind is float else int(value)
    with pytest.raises(WireError) as caught:
        GenerationRequest((1,), **{row.name: value})
    message = str(caught.value)
    assert SENTENCE.match(message) and message.startswith(f"{row.name} must be {rule.allowed}, got ")
    assert f"leave {row.name} out" in message


def test_nan_and_infinity_are_refused() -> None:
    for value in (float("nan"), float("inf")):
        with pytest.raises(WireError, match=r"^length_penalty must be a finite number, got "):
            GenerationRequest((1,), length_penalty=value)


@pytest.mark.parametrize(("values", "message"), [
    ({"prompt": ""}, "prompt is empty; send at least one character or token id."),
    ({"prompt": ()}, "prompt holds no token ids; send at least one."),
    ({"prompt": (1, -2)}, "prompt must be token ids from 0 to 2**31 - 1, got -2; send ids of the model's vocabulary."),
    ({"prompt": (1, True)}, "prompt must be token ids from 0 to 2**31 - 1, got True; send ids of the model's "
                            "vocabulary."),
    ({"prompt": 7}, "prompt must be text or a list of token ids, got 7; send one that is, or leave prompt out."),
    ({"max_tokens": 4, "min_tokens": 5}, "min_tokens must be an integer from 0 to max_tokens (4), got 5; send one "
                                         "that is, or leave min_tokens out."),
    ({"n": 3, "best_of": 2}, "best_of must be an integer >= n (3), got 2; send one that is, or leave best_of out."),
    ({"guide": ("xml", "")}, "guided_decoding_guide_type must be one of json, json_schema, regex, ebnf_grammar, "
                             "choice, got 'xml'; send one of them, or no guide."),
    ({"guide": "json"}, "guide must be a (guide type, guide) pair of strings, got 'json'; send one that is, or leave "
                        "guide out."),
    ({"stop_words": ((1,), (2, -5))}, "stop_words must be token ids from 0 to 2**31 - 1, got -5; send ids of the "
                                      "model's vocabulary."),
    ({"stop_strings": ("a", 1)}, "stop_strings must be a list of strings, got ('a', 1); send one that is, or leave "
                                 "stop_strings out."),
    ({"end_id": -2}, "end_id must be an integer from -1 to 2**31 - 1, got -2; send one that is, or leave end_id out."),
    ({"seed": 2**64}, "seed must be an integer from 0 to 2**64 - 1, got 18446744073709551616; send one that is, or "
                      "leave seed out."),
    ({"lora": "adapter"}, "lora must be a LoraAdapter, got 'adapter'; send one that is, or leave lora out."),
])
def test_a_structured_field_is_refused_in_one_sentence(values: dict, message: str) -> None:
    with pytest.raises(WireError) as caught:
        GenerationRequest(**{"prompt": (1,), **values})
    assert str(caught.value) == message


@pytest.mark.parametrize(("make", "message"), [
    (lambda: LoraAdapter(), "lora_name is empty and no lora_task_id is given; name the adapter or send its task id."),
    (lambda: LoraAdapter("a", 1, weights=np.zeros((2, 4))), "lora_weights came alone, and LoRA inference needs both "
     "lora_weights and lora_config; send the adapter's rows with its config, or neither."),
    (lambda: LoraAdapter("a", weights=np.zeros((2, 4)), config=np.zeros((2, 3))), "lora_task_id must be set for "
     "LoRA inference with lora_weights; send the adapter's task id with its rows."),
    (lambda: LoraAdapter("a", 1, np.zeros((2, 4)), np.zeros((3, 3))), "lora_config [3, 3] must be [N, 3] rows, one "
     "per row of lora_weights [2, 4] ([N, W]); send the rows trtllm-kit lora writes."),
    (lambda: LoraAdapter("a", -1), "lora_task_id must be an integer from 0 to 2**64 - 1, got -1; send one that is, or "
     "leave lora_task_id out."),
    (lambda: DisaggHandle(request_type="both"), "disaggregated_params.request_type must be one of context_only, "
     "generation_only, context_and_generation, got 'both'; send the handle a context-only response returned."),
    (lambda: DisaggHandle.from_wire({"first_gen_tokens": [1, "2"]}), "disaggregated_params.first_gen_tokens must be "
     "a list of token ids, got [1, '2']; send the handle a context-only response returned."),
    (lambda: DisaggHandle.from_wire({"encoded_opaque_state": "@@"}), "disaggregated_params.encoded_opaque_state must "
     "be base64, got '@@'; send the handle a context-only response returned."),
    (lambda: DisaggHandle.from_json("{"), "disaggregated_params is not JSON ('{'); send the handle a context-only "
     "response returned, as a JSON object."),
])
def test_lora_and_disaggregation_refusals_name_the_tensor(make, message: str) -> None:
    with pytest.raises(WireError) as caught:
        make()
    assert str(caught.value) == message


def test_a_disaggregation_handle_round_trips_through_its_wire_form() -> None:
    handle = DisaggHandle(request_type="CONTEXT_ONLY", first_gen_tokens=[4], ctx_request_id=9, opaque_state=b"\x00k",
                          disagg_request_id=3)
    assert handle.request_type == "context_only" and handle.first_gen_tokens == (4,)
    assert handle.to_wire() == {"request_type": "context_only", "first_gen_tokens": [4], "ctx_request_id": 9,
                                "disagg_request_id": 3, "encoded_opaque_state": "AGs="}
    assert DisaggHandle.from_json(handle.to_json()) == handle
    assert DisaggHandle.from_wire({**handle.to_wire(), "unknown": 1}) == handle
