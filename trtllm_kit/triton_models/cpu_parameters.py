"""The CPU ``tensorrt_llm`` model's settings from Triton's model configuration (``args["model_config"]``, JSON):
its ``parameters`` as strings, ``max_batch_size`` and the queue policy's ``max_queue_size`` among them when not
set there, where its checkpoint and tokenizer-info file are, its transaction policy and its torch threads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.threads import StepThreads, default_threads


@dataclass(frozen=True)
class CpuParameters:
    """What ``initialize`` reads from the model configuration.

    Arguments:
        values: every parameter by name (the engine's among them, ``EngineConfig.from_parameters``);
        checkpoint: the TensorRT-LLM checkpoint directory; tokenizer_info: the guided-decoding tokenizer file (None:
        no guided decoding); is_decoupled: one response stream per request (streaming, several sequences);
        exclude_input: the default of ``exclude_input_in_output``; cpu_threads: torch's intra-op threads for the
        served model (``cpu_threads``).
    """

    values: dict[str, str]
    checkpoint: Path
    tokenizer_info: Path | None
    is_decoupled: bool
    exclude_input: bool
    cpu_threads: StepThreads

    @classmethod
    def from_config(cls, config: dict[str, Any], repository: Path) -> CpuParameters:
        """Read a model configuration; relative paths resolve in the model's directory.

        Arguments:
            config: the parsed ``model_config`` JSON; repository: the model's directory (``model_repository``).
        """
        values = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        values.setdefault("max_batch_size", str(config.get("max_batch_size") or ""))
        queue_policy = config.get("dynamic_batching", {}).get("default_queue_policy", {})
        values.setdefault("max_queue_size", str(queue_policy.get("max_queue_size", "")))
        if not values.get("gpt_model_path"):
            raise KitUsageError("the tensorrt_llm model has no gpt_model_path parameter; set it to the "
                                "TensorRT-LLM checkpoint directory.")
        info = values.get("xgrammar_tokenizer_info_path", "")
        return cls(values, repository / values["gpt_model_path"],  # absolute paths stay absolute
                   repository / info if info and "${" not in info else None,
                   bool(config.get("model_transaction_policy", {}).get("decoupled")),
                   values.get("exclude_input_in_output", "false").lower() == "true",
                   cpu_threads(values.get("cpu_threads", "")))

    def lora_cache_size(self) -> tuple[int, int] | None:
        """``(lora_cache_max_adapter_size, lora_cache_host_memory_bytes)`` when the cache is sized in bytes (the
        backend's way) and not in adapters; None otherwise."""
        host_bytes, max_rank = (self.values.get(k) for k in ("lora_cache_host_memory_bytes",
                                                             "lora_cache_max_adapter_size"))
        if host_bytes and max_rank and not self.values.get("lora_cache_max_adapters"):
            return int(max_rank), int(host_bytes)
        return None


def cpu_threads(raw: str, environ: Mapping[str, str] = os.environ) -> StepThreads:
    """The served model's torch intra-op threads: the ``cpu_threads`` parameter for every step, else the runtime's
    default (``runtime/threads.default_threads``).

    Arguments:
        raw: the parameter's string value (empty or ``${...}``: not set); environ: the server's environment.
    """
    raw = raw.strip()
    if not raw or raw.startswith("${"):
        return default_threads(environ)
    if not raw.isdigit() or int(raw) < 1:
        raise KitUsageError(f"parameter cpu_threads is {raw!r}; set it to a whole number of threads, at least 1.")
    return StepThreads.fixed(int(raw))
