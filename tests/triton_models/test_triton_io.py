"""triton_io: inputs read, outputs made and errors coded through a stand-in for Triton's backend module."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.handle import Failure, QueueFullError
from trtllm_kit.triton_models.triton_io import (
    CODES,
    failure_error,
    inner_error,
    input_arrays,
    output_tensors,
    triton_error,
)
from trtllm_kit.wire.error_code import split_code
from trtllm_kit.wire.rules import WireError


class _Tensor:
    def __init__(self, name: str, value: np.ndarray | torch.Tensor) -> None:
        self._name, self.value = name, value

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        assert isinstance(self.value, np.ndarray), "numpy cannot hold this tensor"
        return self.value

    def to_dlpack(self):
        value = self.value if isinstance(self.value, torch.Tensor) else torch.from_numpy(self.value)
        return value.__dlpack__()


class _Error:
    CANCELLED, INVALID_ARG, UNAVAILABLE, INTERNAL = "C", "I", "U", "X"

    def __init__(self, message: str, code: str = "X") -> None:
        self.message, self.code = message, code


def _pb(inputs: dict[str, np.ndarray | torch.Tensor]) -> SimpleNamespace:
    return SimpleNamespace(
        get_input_tensor_by_name=lambda request, name: _Tensor(name, inputs[name]) if name in inputs else None,
        Tensor=_Tensor, TritonError=_Error)


def test_inputs_are_read_by_name_and_absent_ones_left_out() -> None:
    pb = _pb({"input_ids": np.array([[1, 2, 3]], np.int32), "end_id": np.array([[2]], np.int32)})
    arrays = input_arrays(pb, object(), ("input_ids", "end_id", "pad_id"))
    assert sorted(arrays) == ["end_id", "input_ids"]
    assert arrays["input_ids"].tolist() == [[1, 2, 3]]


def test_bf16_lora_weights_arrive_as_their_bit_patterns() -> None:
    rows = torch.tensor([[1.0, -2.5, 0.15625]], dtype=torch.bfloat16)
    arrays = input_arrays(_pb({"lora_weights": rows}), object(), ("lora_weights",))
    assert arrays["lora_weights"].dtype == np.uint16
    assert arrays["lora_weights"].tolist() == [[0x3F80, 0xC020, 0x3E20]]


def test_fp16_lora_weights_stay_fp16() -> None:
    rows = np.array([[1.0, -2.5]], np.float16)
    arrays = input_arrays(_pb({"lora_weights": rows}), object(), ("lora_weights",))
    assert arrays["lora_weights"].dtype == np.float16 and arrays["lora_weights"].tolist() == [[1.0, -2.5]]


@pytest.mark.parametrize("batched, shape", [(True, (1, 3)), (False, (3,))])
def test_outputs_gain_the_batch_dimension_only_when_batched(batched: bool, shape: tuple[int, ...]) -> None:
    (tensor,) = output_tensors(_pb({}), {"output_ids": np.array([4, 5, 6], np.int32)}, batched)
    assert tensor.name() == "output_ids" and tensor.value.shape == shape


@pytest.mark.parametrize("exc, code, message", [
    (WireError("top_k", "runtime_top_k must be >= 0, got -1."), "I",
     "[INVALID_ARG] runtime_top_k must be >= 0, got -1."),
    (KitUsageError("request_output_len is missing."), "I", "[INVALID_ARG] request_output_len is missing."),
    (QueueFullError("the request queue is full."), "U", "[UNAVAILABLE] the request queue is full."),
    (RuntimeError("boom"), "X", "[INTERNAL] RuntimeError: boom"),
])
def test_each_exception_has_its_code_and_its_message_begins_with_it(exc: Exception, code: str, message: str) -> None:
    error = triton_error(_pb({}), exc)
    assert (error.code, error.message) == (code, message)


def test_each_failure_kind_has_its_code() -> None:
    errors = {kind: failure_error(_pb({}), "why", kind) for kind in Failure}
    assert {kind: error.code for kind, error in errors.items()} == {
        Failure.CANCELLED: "C", Failure.INVALID: "I", Failure.UNAVAILABLE: "U", Failure.INTERNAL: "X"}
    assert [split_code(error.message) for error in errors.values()] == [
        (CODES[kind], "why") for kind in errors]


@pytest.mark.parametrize("message, code, expected", [
    ("[INVALID_ARG] beam_width = 2 is refused.", "X", ("I", "[INVALID_ARG] beam_width = 2 is refused.")),
    ("Prompt length exceeds max input len.", "I", ("I", "[INVALID_ARG] Prompt length exceeds max input len.")),
    ("a code the stub does not name", "?", ("X", "[INTERNAL] a code the stub does not name")),
])
def test_an_inner_error_keeps_its_mark_or_is_marked_with_its_code(message: str, code: str,
                                                                  expected: tuple[str, str]) -> None:
    error = inner_error(_pb({}), message, code)
    assert (error.code, error.message) == expected
