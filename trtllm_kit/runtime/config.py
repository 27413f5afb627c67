"""The CPU runtime's batching parameters: what the ``tensorrt_llm`` model's ``config.pbtxt`` says of batch size,
tokens per step, the paged KV pool, the scheduler policy and the queue (the engine and the scheduler both read
them)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from trtllm_kit.defaults import DEFAULT_MAX_LORAS, DEFAULT_TOKENS_PER_BLOCK
from trtllm_kit.enums import RUNTIME_SCHEDULER_POLICIES as POLICIES
from trtllm_kit.enums import SchedulerPolicy
from trtllm_kit.errors import KitUsageError


@dataclass
class EngineConfig:
    """The ``tensorrt_llm`` model's batching parameters (names as in its ``config.pbtxt``)."""

    max_batch_size: int = 8
    max_num_tokens: int = 512
    tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK
    max_tokens_in_paged_kv_cache: int = 8192
    batch_scheduler_policy: str = SchedulerPolicy.GUARANTEED_NO_EVICT.value
    enable_kv_cache_reuse: bool = True
    enable_chunked_context: bool = False
    max_queue_size: int = 0  # 0 = unbounded
    max_seq_len: int = 0  # input + output tokens of one request; 0 = only the pool bounds it
    lora_cache_max_adapters: int = DEFAULT_MAX_LORAS  # adapters held at once; the least recently used is evicted

    def __post_init__(self) -> None:
        if self.batch_scheduler_policy not in POLICIES:
            raise KitUsageError(f"batch_scheduler_policy is {self.batch_scheduler_policy!r}; use one of "
                                f"{', '.join(POLICIES)}.")
        for name in ("max_batch_size", "max_num_tokens", "tokens_per_block", "lora_cache_max_adapters"):
            if getattr(self, name) < 1:
                raise KitUsageError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.max_tokens_in_paged_kv_cache < self.tokens_per_block:
            raise KitUsageError(f"max_tokens_in_paged_kv_cache {self.max_tokens_in_paged_kv_cache} holds not even "
                                f"one block of tokens_per_block {self.tokens_per_block}; raise it.")

    @property
    def num_kv_blocks(self) -> int:
        return self.max_tokens_in_paged_kv_cache // self.tokens_per_block

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> EngineConfig:
        """Read the fields from string parameters; absent, empty and ``${...}`` values keep the defaults.

        Arguments:
            parameters: name → string value (a Triton model's ``parameters``).
        """
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = str(parameters.get(f.name, "")).strip()
            if not raw or (raw.startswith("${") and raw.endswith("}")):
                continue
            if f.type == "bool":
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise KitUsageError(f"parameter {f.name} is {raw!r}; use true or false.")
                values[f.name] = raw.lower() in ("true", "1", "yes")
            elif f.type == "int":
                try:
                    values[f.name] = int(raw)
                except ValueError:
                    raise KitUsageError(f"parameter {f.name} is {raw!r}; it must be an integer.") from None
            else:
                values[f.name] = raw
        return cls(**values)
