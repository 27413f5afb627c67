"""Triton's Python-backend I/O for the kit's model files, apart from any one model: a request's inputs as numpy
arrays, arrays as output tensors, an exception or a failure kind as a ``TritonError``.

``pb_utils`` (``triton_python_backend_utils``, present only inside Triton) is passed in by the model file, so this
module imports without Triton and its tests hand it a stand-in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from trtllm_kit.runtime.handle import Failure, failure_of
from trtllm_kit.wire import error_code

# the one input that may arrive as BF16 (a model's own dtype), which numpy cannot hold: read through dlpack
BF16_INPUTS = ("lora_weights",)
CODES = {Failure.CANCELLED: "CANCELLED", Failure.INVALID: "INVALID_ARG", Failure.UNAVAILABLE: "UNAVAILABLE",
         Failure.INTERNAL: "INTERNAL"}  # each failure kind's TritonError code


def input_arrays(pb_utils: Any, request: Any, names: Iterable[str]) -> dict[str, np.ndarray]:
    """The request's inputs among ``names`` as numpy arrays (absent ones left out); a BF16 ``lora_weights`` as its
    bit patterns in a ``uint16`` array (the wire's BF16 form).

    Arguments:
        pb_utils: Triton's backend module; request: a ``pb_utils.InferenceRequest``; names: the inputs to read.
    """
    arrays = {}
    for name in names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            continue
        arrays[name] = _dlpack_array(tensor) if name in BF16_INPUTS else tensor.as_numpy()
    return arrays


def _dlpack_array(tensor: Any) -> np.ndarray:
    import torch  # only a request carrying LoRA rows needs it

    rows = torch.from_dlpack(tensor.to_dlpack())
    return rows.view(torch.int16).numpy().view(np.uint16) if rows.dtype == torch.bfloat16 else rows.numpy()


def output_tensors(pb_utils: Any, arrays: Mapping[str, np.ndarray], batched: bool) -> list[Any]:
    """Encoded response arrays as ``pb_utils.Tensor`` outputs.

    Arguments:
        pb_utils: Triton's backend module; arrays: the response's tensors by name, as the wire encodes them;
        batched: whether the model has ``max_batch_size`` > 0 (each array gains Triton's batch dimension of 1).
    """
    return [pb_utils.Tensor(name, array[None] if batched else array) for name, array in arrays.items()]


def failure_error(pb_utils: Any, message: str, kind: Failure) -> Any:
    """A ``TritonError`` carrying ``message`` with the code of ``kind``, which also marks its message
    (``wire/error_code.py``: a client's gRPC stream gets the message alone).

    Arguments:
        pb_utils: Triton's backend module; message: what the client reads; kind: the failure.
    """
    return coded_error(pb_utils, message, CODES[kind])


def coded_error(pb_utils: Any, message: str, code: str) -> Any:
    """A ``TritonError`` with ``code`` whose message begins with it (``wire/error_code.py``).

    Arguments:
        pb_utils: Triton's backend module; message: what the client reads; code: ``TritonError``'s name of it.
    """
    return pb_utils.TritonError(error_code.with_code(message, code), getattr(pb_utils.TritonError, code))


def inner_error(pb_utils: Any, message: str, code: int) -> Any:
    """The ``TritonError`` a model passes on for a model it called that answered ``message`` with ``code``: with
    the inner message's own mark (the Python backend gives the caller every inner error as INTERNAL), or, for an
    unmarked one (the C++ backend's), marked with ``code``.

    Arguments:
        pb_utils: Triton's backend module; message: the inner error's message; code: its ``TritonError`` code.
    """
    named = next((name for name in error_code.CODES if getattr(pb_utils.TritonError, name, None) == code), "INTERNAL")
    return coded_error(pb_utils, message, error_code.split_code(message)[0] or named)


def triton_error(pb_utils: Any, exc: BaseException) -> Any:
    """The ``TritonError`` a request that raised ``exc`` is answered with: a refusal of the request (``WireError``,
    ``KitUsageError``) is INVALID_ARG, a full queue UNAVAILABLE, anything else INTERNAL (named by its type).

    Arguments:
        pb_utils: Triton's backend module; exc: what reading, submitting or running the request raised.
    """
    kind = failure_of(exc)
    return failure_error(pb_utils, str(exc) if kind is not Failure.INTERNAL else f"{type(exc).__name__}: {exc}", kind)
