"""An adapter converted for each target, written into a new directory ``OUT/lora/NAME/``.

- ``cpu``: ``adapter.safetensors``, per layer and module A ``[r, in]`` and B ``[out, r]`` with the scale in B, in
  the checkpoint's dtype (``trtllm_kit.runtime.lora.load_adapter`` reads it).
- ``engine``: the backend's request tensors as TensorRT-LLM's ``hf_lora_convert.py`` writes them:
  ``model.lora_weights.npy`` ``[1, N, W]`` (per module and layer, A then B·scale flattened, zero-padded) and
  ``model.lora_config.npy`` INT32 ``[1, N, 3]`` (module id, layer, rank). The weights are the engine's dtype;
  numpy has no bfloat16, so a bfloat16 engine's weights are float32 values that are exactly bfloat16 (sent as
  Triton ``BF16``, which keeps them bit for bit).
- ``llmapi``: the PEFT directory itself (``adapter_config.json`` and ``adapter_model.safetensors``, byte for
  byte as they were read and checked), which ``LoRARequest(lora_path=...)`` loads; TensorRT-LLM's loader applies
  the scale.

The targets whose LoRA modules are fixed at build time (an engine's LoRA plugin, the llmapi ``LoraConfig``) take
only adapters of those modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from trtllm_kit.lora.peft_adapter import CONFIG_NAME, WEIGHTS_NAME, PeftAdapter
from trtllm_kit.runtime.lora import ADAPTER_FILE, tensor_names, to_rows

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ENGINE_WEIGHTS, ENGINE_CONFIG = "model.lora_weights.npy", "model.lora_config.npy"


def write_runtime(adapter: PeftAdapter, into: Path, dtype: str) -> None:
    """The CPU runtime's ``adapter.safetensors``."""
    tensors = {}
    for (layer, module), (a, b) in adapter.converted(TORCH_DTYPES.get(dtype, torch.float32)).items():
        a_name, b_name = tensor_names(layer, module)
        tensors[a_name], tensors[b_name] = a, b
    save_file(tensors, into / ADAPTER_FILE, metadata={"rank": str(adapter.rank), "alpha": str(adapter.alpha)})


def write_engine(adapter: PeftAdapter, into: Path, dtype: str) -> None:
    """The backend's ``model.lora_weights.npy`` and ``model.lora_config.npy``."""
    weights, config = to_rows(adapter.converted(TORCH_DTYPES.get(dtype, torch.float32)))
    stored = weights.numpy() if dtype in ("float16", "float32") else weights.to(torch.float32).numpy()
    np.save(into / ENGINE_WEIGHTS, stored[None])
    np.save(into / ENGINE_CONFIG, config.numpy()[None])


def write_peft(adapter: PeftAdapter, into: Path, dtype: str) -> None:
    """The PEFT directory, as it was checked: the bytes read, not the source read again."""
    (into / CONFIG_NAME).write_bytes(adapter.config_bytes)
    (into / WEIGHTS_NAME).write_bytes(adapter.weights_bytes)


@dataclass(frozen=True)
class AdapterFormat:
    """How a target takes adapters: the writer, and whether its LoRA modules are fixed at build time."""

    write: Callable[[PeftAdapter, Path, str], None]
    fixed_modules: bool


FORMATS = {"cpu": AdapterFormat(write_runtime, fixed_modules=False),
           "engine": AdapterFormat(write_engine, fixed_modules=True),
           "llmapi": AdapterFormat(write_peft, fixed_modules=True)}
