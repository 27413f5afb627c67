"""A request's LoRA adapter as it goes over the wire: its name for llmapi models, its task id and rows for
``tensorrt_llm`` (and the ensemble and BLS, which pass them on), the rows in the model's ``lora_weights`` type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from trtllm_kit.wire.lora import weights_as as weights_as  # float32 rows in a model's lora_weights type

LORA_INPUTS = ("lora_task_id", "lora_weights", "lora_config")  # upstream's inputs of tensorrt_llm


@dataclass(frozen=True)
class LoraInputs:
    """A request's LoRA adapter: its name (what an llmapi model takes) and task id (the ``tensorrt_llm`` cache key),
    and, on a task's first request or after an eviction, its rows (``lora_weights`` [N, W] as float32 and
    ``lora_config`` [N, 3]; read, off the event loop, only when sent to ``tensorrt_llm``)."""

    name: str
    task_id: int
    rows: Callable[[], Awaitable[tuple[np.ndarray, np.ndarray]]] | None = None
