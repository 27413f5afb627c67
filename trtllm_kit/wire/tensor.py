"""Tensors as the wire sees them: a declaration (name, Triton data type, dims, required), the numpy type of each
data type, and the reading and making of one tensor's array.

Arrays are shaped as the model's ``config.pbtxt`` declares them, without Triton's batch dimension: a transport adds
it for a model with ``max_batch_size`` > 0 (``tensorrt_llm``, ``ensemble``, ``tensorrt_llm_bls``) and not for the
llmapi model (``max_batch_size: 0``). Readers take an array with or without it. STRING tensors hold UTF-8
``bytes`` in an ``object`` array; BF16 ones hold their bit patterns in a ``uint16`` array.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from trtllm_kit.wire.rules import Rule, WireError

NUMPY = {"BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32,
         "FP16": np.float16, "BF16": np.uint16, "STRING": np.object_}
# the data type gRPC's ``ModelInferRequest`` names for an array of each numpy type (STRING is BYTES there)
GRPC = {np.dtype(np.bool_): "BOOL", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
        np.dtype(np.uint64): "UINT64", np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16",
        np.dtype(np.uint16): "BF16", np.dtype(np.object_): "BYTES"}


class Tensor(NamedTuple):
    """One input or output of a model."""

    name: str
    data_type: str  # the ``DataType`` enum name without ``TYPE_``, e.g. "INT32"
    dims: tuple[int, ...] = (1,)
    required: bool = False


def by_name(tensors: tuple[Tensor, ...]) -> dict[str, Tensor]:
    """Index a table by tensor name.

    Arguments:
        tensors: a table.
    """
    return {t.name: t for t in tensors}


def grpc_datatype(array: np.ndarray) -> str:
    """The data type a gRPC request names for ``array`` (as the wire's codecs make it).

    Arguments:
        array: an encoded tensor.
    """
    return GRPC[array.dtype]


def scalar_array(value: Any, data_type: str) -> np.ndarray:
    """A one-value tensor of ``data_type`` ([1]).

    Arguments:
        value: the value (a string for STRING); data_type: the Triton type.
    """
    if data_type == "STRING":
        return np.array([str(value).encode()], dtype=np.object_)
    return np.array([value], dtype=NUMPY[data_type])


def strings_array(values: tuple[str, ...] | list[str]) -> np.ndarray:
    """A STRING tensor of several values ([len(values)]).

    Arguments:
        values: the strings.
    """
    return np.array([v.encode() for v in values], dtype=np.object_)


def text_of(value: Any, name: str) -> str:
    """One STRING element as text; bytes that are not UTF-8 are refused.

    Arguments:
        value: the element; name: its tensor, for the refusal.
    """
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(name, f"{name} is not UTF-8 text (byte {value[exc.start]:#04x} at offset {exc.start}); "
                              "send UTF-8.") from None


def read_scalar(arrays: Mapping[str, np.ndarray], name: str, rule: Rule | None = None) -> Any:
    """The one value of tensor ``name`` as a Python value (None when the request does not carry it); a tensor of
    another size is refused, and so is a value ``rule`` refuses.

    Arguments:
        arrays: the request's tensors by name; name: the tensor; rule: its rule (None: unchecked).
    """
    array = arrays.get(name)
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    if flat.size != 1:
        raise WireError(name, f"{name} must hold one value, got {flat.size}; send a tensor of shape [1].")
    value = flat[0]
    value = text_of(value, name) if isinstance(value, bytes | str) else value.item()
    return value if rule is None else rule.checked(name, value)


def read_strings(arrays: Mapping[str, np.ndarray], name: str) -> tuple[str, ...] | None:
    """Every value of STRING tensor ``name`` as text (None when the request does not carry it).

    Arguments:
        arrays: the request's tensors by name; name: the tensor.
    """
    array = arrays.get(name)
    return None if array is None else tuple(text_of(v, name) for v in np.asarray(array).reshape(-1))


def read_ids(arrays: Mapping[str, np.ndarray], name: str) -> tuple[int, ...] | None:
    """The token ids of tensor ``name``, flattened (None when absent).

    Arguments:
        arrays: the tensors by name; name: the tensor.
    """
    array = arrays.get(name)
    return None if array is None else tuple(int(t) for t in np.asarray(array).reshape(-1))


def is_stop_request(arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether a request stops the running requests of its request id (``stop`` true) rather than generating; the
    same in both dialects.

    Arguments:
        arrays: the request's tensors.
    """
    return read_scalar(arrays, "stop", Rule(bool)) is True
