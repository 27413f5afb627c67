"""A request's LoRA adapter as it travels: its name (what an llmapi model takes, ``lora_name``), its task id (the
``tensorrt_llm`` adapter cache's key, ``lora_task_id``) and, on a task's first request or after the cache evicted
it, its rows (``lora_weights`` [N, W] and ``lora_config`` [N, 3], upstream's layout).

The rows travel in the model's ``lora_weights`` type: FP32, FP16, or BF16 as its 16-bit patterns in a ``uint16``
array (numpy has no bfloat16; Triton reads the raw bytes). The record holds them as float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trtllm_kit.wire.rules import INT_RANGES, Rule, WireError
from trtllm_kit.wire.tensor import Tensor

WEIGHTS_TYPES = ("FP32", "FP16", "BF16")  # lora_weights' Triton types: the model's own dtype
TASK_ID = Rule(int, 0).bounded("UINT64")


def lora_tensors(weights_type: str) -> tuple[Tensor, ...]:
    """Upstream's LoRA inputs of ``tensorrt_llm`` (and of the ensemble and BLS, which pass them on unchanged).

    Arguments:
        weights_type: ``lora_weights``' data type, the model's own (``FP16``, ``BF16``, ``FP32``).
    """
    return (Tensor("lora_task_id", "UINT64"), Tensor("lora_weights", weights_type, (-1, -1)),
            Tensor("lora_config", "INT32", (-1, 3)))


def weights_as(weights: np.ndarray, datatype: str) -> np.ndarray:
    """float32 rows in a model's ``lora_weights`` type; BF16 as its bit patterns, rounded to nearest even.

    Arguments:
        weights: the rows as float32; datatype: ``FP32``, ``FP16`` or ``BF16``.
    """
    if datatype not in WEIGHTS_TYPES:
        raise WireError("lora_weights", f"lora_weights cannot be sent as {datatype}; a model takes "
                                        f"{', '.join(WEIGHTS_TYPES)} (its own dtype).")
    if datatype == "BF16":
        bits = np.ascontiguousarray(weights, np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return weights.astype(np.float32 if datatype == "FP32" else np.float16)


def weights_from(array: np.ndarray) -> np.ndarray:
    """``lora_weights`` as float32: FP32 and FP16 as they are, a ``uint16`` array as BF16 bit patterns.

    Arguments:
        array: the tensor as it arrived.
    """
    if array.dtype == np.uint16:
        return (array.astype(np.uint32) << 16).view(np.float32)
    if array.dtype not in (np.float32, np.float16):
        raise WireError("lora_weights", f"lora_weights must be FP32, FP16 or BF16, got {array.dtype}; send the "
                                        "rows in the model's dtype.")
    return array.astype(np.float32)


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """The adapter a request runs with.

    Arguments:
        name: the adapter's name (llmapi models resolve it; "" when only the task id is known);
        task_id: the ``tensorrt_llm`` cache key (None: not sent); weights: [N, W] float32 rows and config: [N, 3]
        integer rows, both or neither (None: the cache holds the task).
    """

    name: str = ""
    task_id: int | None = None
    weights: np.ndarray | None = None
    config: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise WireError("lora_name", f"lora_name must be a string, got {self.name!r:.60}; send the adapter's "
                                         "name.")
        if self.task_id is not None:
            object.__setattr__(self, "task_id", TASK_ID.checked("lora_task_id", self.task_id))
        if (self.weights is None) != (self.config is None):
            given = "lora_weights" if self.weights is not None else "lora_config"
            raise WireError(given, f"{given} came alone, and LoRA inference needs both lora_weights and lora_config; "
                                   "send the adapter's rows with its config, or neither.")
        if self.weights is not None and self.task_id is None:
            raise WireError("lora_task_id", "lora_task_id must be set for LoRA inference with lora_weights; send "
                                            "the adapter's task id with its rows.")
        if not self.name and self.task_id is None:
            raise WireError("lora_name", "lora_name is empty and no lora_task_id is given; name the adapter or send "
                                         "its task id.")
        if self.weights is not None and self.config is not None:
            weights, config = np.asarray(self.weights), np.asarray(self.config)
            if weights.ndim != 2 or config.ndim != 2 or config.shape[1] != 3 or len(weights) != len(config):
                raise WireError("lora_config", f"lora_config {list(config.shape)} must be [N, 3] rows, one per row "
                                               f"of lora_weights {list(weights.shape)} ([N, W]); send the rows "
                                               "trtllm-kit lora writes.")
            low, high = INT_RANGES["INT32"]
            if config.size and (config.min() < low or config.max() > high):
                raise WireError("lora_config", "lora_config holds values outside INT32; send the rows trtllm-kit "
                                               "lora writes.")
            object.__setattr__(self, "weights", weights.astype(np.float32))
            object.__setattr__(self, "config", config.astype(np.int32))

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, LoraAdapter):
            return NotImplemented
        return (self.name, self.task_id) == (other.name, other.task_id) and all(
            (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))
            for a, b in ((self.weights, other.weights), (self.config, other.config)))

    __hash__ = None  # type: ignore[assignment]

    @property
    def has_rows(self) -> bool:
        """Whether the request carries the adapter's rows."""
        return self.weights is not None
