"""The CPU ``LLM``'s adapters: a ``LoRARequest``'s PEFT directory read, checked against the base and converted as
TensorRT-LLM's loader converts it (the scale multiplied into B), for the CPU runtime's LoRA math.

As in TensorRT-LLM's ``LoraManager``, an adapter id already loaded is not read again (an id names one adapter);
at most ``max_cpu_loras`` converted adapters are kept in host memory, the least recently used dropped first. The
runtime's own cache holds ``max_loras`` of them (``EngineConfig.lora_cache_max_adapters``).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from trtllm_kit.defaults import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS
from trtllm_kit.llmapi.cpu_types import LoRARequest
from trtllm_kit.lora.peft_adapter import read_adapter
from trtllm_kit.runtime.lora import AdapterWeights, Pair
from trtllm_kit.runtime.lora_modules import TRTLLM_MODULES


class CpuLoraManager:
    """The adapters of one ``LLM``, loaded on first use per id."""

    def __init__(self, lora_config: dict[str, Any], base: dict[str, Any], dtype: torch.dtype) -> None:
        """Arguments:
        lora_config: ``LoraConfig``'s fields (``lora_target_modules``, ``max_lora_rank``, ``max_cpu_loras``);
        base: the checkpoint's ``config.json`` as the runtime loaded it; dtype: the runtime's compute dtype.
        """
        self.base, self.dtype = base, dtype
        self.max_lora_rank = int(lora_config.get("max_lora_rank") or DEFAULT_MAX_LORA_RANK)
        self.capacity = int(lora_config.get("max_cpu_loras") or DEFAULT_MAX_LORAS)
        trtllm_names = set(lora_config.get("lora_target_modules") or [])
        self.enabled = {m for m, (name, _) in TRTLLM_MODULES.items() if name in trtllm_names} or set(TRTLLM_MODULES)
        self.loaded: OrderedDict[int, dict[tuple[int, str], Pair]] = OrderedDict()

    def resolve(self, request: LoRARequest) -> AdapterWeights:
        """The runtime's request of ``request``'s adapter (read and converted on first use of its id).

        Arguments:
            request: the request's ``LoRARequest``.
        """
        pairs = self.loaded.get(request.lora_int_id)
        if pairs is None:
            adapter = read_adapter(Path(request.lora_path), self.base, self.max_lora_rank)
            outside = sorted(set(adapter.target_modules) - self.enabled)
            if outside:
                raise ValueError(f"adapter {request.lora_name} adapts {', '.join(outside)}, which lora_config's "
                                 f"lora_target_modules does not enable; rebuild with --lora-target-modules naming "
                                 "them")
            pairs = adapter.converted(self.dtype)
            if len(self.loaded) >= self.capacity:
                self.loaded.popitem(last=False)
            self.loaded[request.lora_int_id] = pairs
        self.loaded.move_to_end(request.lora_int_id)
        return AdapterWeights(request.lora_int_id, pairs)
