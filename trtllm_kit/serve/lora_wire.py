"""A request's LoRA adapter as it goes over the wire: its name for llmapi models, its task id and rows for
``tensorrt_llm`` (and the ensemble and BLS, which pass them on), the rows in the model's ``lora_weights`` type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

LORA_INPUTS = ("lora_task_id", "lora_weights", "lora_config")  # upstream's inputs of tensorrt_llm


@dataclass(frozen=True)
class LoraInputs:
    """A request's LoRA adapter: its name (what an llmapi model takes) and task id (the ``tensorrt_llm`` cache key),
    and, on a task's first request or after an eviction, its rows (``lora_weights`` [N, W] as float32 and
    ``lora_config`` [N, 3]; read, off the event loop, only when sent to ``tensorrt_llm``)."""

    name: str
    task_id: int
    rows: Callable[[], Awaitable[tuple[np.ndarray, np.ndarray]]] | None = None


def weights_as(weights: np.ndarray, datatype: str) -> np.ndarray:
    """float32 ``lora_weights`` in the model's type: FP32, FP16, or BF16 as its 16-bit patterns (numpy has no
    bfloat16; Triton reads the raw bytes), rounded to nearest even.

    Arguments:
        weights: the rows as float32; datatype: the model's ``lora_weights`` type (``FP32``, ``FP16``, ``BF16``).
    """
    if datatype == "BF16":
        bits = np.ascontiguousarray(weights, np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return weights.astype({"FP32": np.float32, "FP16": np.float16}[datatype])
