"""The wire's tensors are the ones the repositories declare and the model files, runtime and client spell: same
names, types, dims and required flags, so moving the callers onto the wire cannot change the Triton contract."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trtllm_kit.model_repo import tensors as T
from trtllm_kit.targets import llmapi_repo
from trtllm_kit.wire import llmapi, llmapi_response, text, trtllm, trtllm_response
from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.request import GenerationRequest

PACKAGE = Path(trtllm.__file__).parents[1]
WEIGHTS_TYPES = ("FP32", "FP16", "BF16")


def as_tuples(tensors) -> set[tuple]:
    return {tuple(t) for t in tensors}


@pytest.mark.parametrize("weights_type", WEIGHTS_TYPES)
def test_tensorrt_llm_inputs_are_the_declared_ones(weights_type: str) -> None:
    declared = T.by_name((*T.TRTLLM_INPUTS, *T.lora_inputs(weights_type)))
    wire = trtllm.request_tensors(weights_type)
    assert [tuple(t) for t in wire] == [tuple(declared[t.name]) for t in wire]
    assert {t.name for t in T.TRTLLM_INPUTS if t.required} == {t.name for t in wire if t.required}


def test_tensorrt_llm_outputs_are_the_declared_ones() -> None:
    declared = T.by_name((*T.TRTLLM_OUTPUTS, *T.LOGPROB_OUTPUTS))
    assert [tuple(t) for t in trtllm_response.RESPONSE_TENSORS] == [
        tuple(declared[t.name]) for t in trtllm_response.RESPONSE_TENSORS]
    assert tuple(trtllm_response.TEXT_OUTPUT) in as_tuples(T.TEXT_OUTPUTS)


@pytest.mark.parametrize("weights_type", WEIGHTS_TYPES)
def test_text_interface_inputs_are_the_declared_ones(weights_type: str) -> None:
    declared = T.by_name((*(t for t, _ in T.TEXT_INPUTS), *T.lora_inputs(weights_type)))
    wire = text.request_tensors(weights_type)
    assert [tuple(t) for t in wire] == [tuple(declared[t.name]) for t in wire]


PREPROCESSED = {"REQUEST_OUTPUT_LEN": "REQUEST_OUTPUT_LEN", "END_ID": "OUT_END_ID"}  # passed on unchanged


def _through_text(name: str) -> str | None:
    """The tensorrt_llm input a text-interface input feeds: passed through, or via preprocessing."""
    passed = {t.name: trtllm_name for t, trtllm_name in T.TEXT_INPUTS}
    if passed.get(name) is not None:
        return passed[name]
    pre = next(p for p, t in T.PREPROCESSING_FROM_TEXT.items() if t == name)
    return next(trtllm_name for out, _, trtllm_name in T.PREPROCESSING_TO_TRTLLM if out == PREPROCESSED[pre])


def test_a_field_is_one_tensorrt_llm_input_on_both_paths() -> None:
    """The text interface feeds each field to the same tensorrt_llm input the token path sends it as."""
    for row in (r for r in rows(GenerationRequest) if r.is_scalar and r.tensor("text") and r.tensor("trtllm")):
        assert _through_text(row.tensor("text")) == row.tensor("trtllm"), row.name


def test_llmapi_tensors_are_exactly_the_declared_ones() -> None:
    assert as_tuples(llmapi.request_tensors()) == as_tuples(llmapi_repo.INPUTS)
    assert as_tuples(llmapi_response.RESPONSE_TENSORS) == as_tuples(llmapi_repo.OUTPUTS)


def _constants(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)}


@pytest.mark.parametrize("source", ["triton_models/tensorrt_llm_cpu.py", "runtime/response.py",
                                    "serve/client.py", "triton_models/tensorrt_llm_bls.py"])
def test_every_tensorrt_llm_tensor_the_code_spells_is_on_the_wire(source: str) -> None:
    """Each tensorrt_llm tensor the model file, the runtime's outputs, the client or the BLS names is one the wire
    reads or writes: the switch loses none."""
    dialect = {t.name for t in (*T.TRTLLM_INPUTS, *T.TRTLLM_OUTPUTS, *T.LOGPROB_OUTPUTS, *T.lora_inputs("FP32"))}
    wire = {t.name for t in (*trtllm.request_tensors(), *trtllm_response.RESPONSE_TENSORS)}
    # read by no kit code: the BLS passes them on, and neither runtime produces them
    passed_on = {"prompt_embedding_table", "prompt_vocab_size", "batch_index", "first_scheduled_time_ns",
                 "bad_words_list", "embedding_bias", "pad_id"}
    spelled = _constants(PACKAGE / source) & dialect
    assert spelled - passed_on <= wire
