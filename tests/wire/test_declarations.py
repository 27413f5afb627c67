"""The wire's tensors are the ones the repositories declare and the model files, runtime and client spell: same
names, types, dims and required flags, so moving the callers onto the wire cannot change the Triton contract. The
declarations keep only each model's order of tensors: every wire tensor is in it once."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trtllm_kit.model_repo import tensors as T
from trtllm_kit.targets import llmapi_repo
from trtllm_kit.wire import llmapi, llmapi_response, text, trtllm, trtllm_response
from trtllm_kit.wire.fields import WIRE_KEY, Row, placed, rows, wire
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
    declared = T.by_name((*T.TRTLLM_OUTPUTS, *T.LOGPROB_OUTPUTS, *T.DRAFT_OUTPUTS))
    wire = (*trtllm_response.RESPONSE_TENSORS, *trtllm_response.DRAFT_ACCEPTANCE.values())
    assert [tuple(t) for t in wire] == [tuple(declared[t.name]) for t in wire]
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


@pytest.mark.parametrize(("order", "wire", "upstream"), [
    (T.TRTLLM_INPUT_ORDER, trtllm.request_tensors(), T.UPSTREAM_INPUTS),
    ((*T.TRTLLM_OUTPUT_ORDER, *T.LOGPROB_OUTPUT_ORDER), trtllm_response.RESPONSE_TENSORS, T.UPSTREAM_OUTPUTS),
    (T.TEXT_INPUT_ORDER, text.request_tensors(), T.UPSTREAM_TEXT_INPUTS),
], ids=["tensorrt_llm inputs", "tensorrt_llm outputs", "text inputs"])
def test_each_order_names_every_wire_tensor_once_beside_upstreams_own(order, wire, upstream) -> None:
    """A declaration lists its tensors' order; their types come from the wire, or for upstream's tensors no kit code
    reads, from the declaration: each name is in exactly one of the two."""
    wire_names = {t.name for t in wire} - {t.name for t in T.lora_inputs("FP32")}
    assert len(order) == len(set(order))
    assert set(order) == wire_names | set(upstream) and not wire_names & set(upstream)


@pytest.mark.parametrize(("dialect", "order"), [("trtllm", T.TRTLLM_INPUT_ORDER), ("text", T.TEXT_INPUT_ORDER)])
def test_a_placed_row_stands_where_it_says_and_the_rest_keep_their_order(dialect, order) -> None:
    places = {row.tensor(dialect): at for row in rows(GenerationRequest) if (at := row.place(dialect)) is not None}
    assert places and all(order[at] == name for name, at in places.items())


def test_placed_puts_each_row_at_its_index_and_keeps_the_others_in_order() -> None:
    def row(name: str, at: int) -> Row:
        return Row(name, wire("", dtype="INT32", trtllm=name, trtllm_at=at)[WIRE_KEY])

    assert placed(("a", "b", "c"), "trtllm", (row("y", 3), row("x", 0))) == ("x", "a", "b", "y", "c")


def test_the_bls_passes_through_what_the_text_interface_feeds_tensorrt_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", SimpleNamespace())
    spec = importlib.util.spec_from_file_location("bls", PACKAGE / "triton_models/tensorrt_llm_bls.py")
    assert spec is not None and spec.loader is not None
    bls = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bls)
    assert sorted(bls.PASSTHROUGH_INPUTS) == sorted((t.name, feeds) for t, feeds in T.TEXT_INPUTS if feeds)


def _constants(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)}


@pytest.mark.parametrize("source", ["triton_models/tensorrt_llm_cpu.py", "runtime/response.py",
                                    "serve/client.py", "triton_models/tensorrt_llm_bls.py"])
def test_every_tensorrt_llm_tensor_the_code_spells_is_on_the_wire(source: str) -> None:
    """Each tensorrt_llm tensor the model file, the runtime's outputs, the client or the BLS names is one the wire
    reads or writes: the switch loses none."""
    dialect = {t.name for t in (*T.TRTLLM_INPUTS, *T.TRTLLM_OUTPUTS, *T.LOGPROB_OUTPUTS, *T.DRAFT_OUTPUTS,
                                 *T.lora_inputs("FP32"))}
    wire = {t.name for t in (*trtllm.request_tensors(), *trtllm_response.RESPONSE_TENSORS)}
    # read by no kit code: the BLS passes them on, and neither runtime produces them
    passed_on = {"prompt_embedding_table", "prompt_vocab_size", "batch_index", "first_scheduled_time_ns",
                 "bad_words_list", "embedding_bias", "pad_id"}
    spelled = _constants(PACKAGE / source) & dialect
    assert spelled - passed_on <= wire
