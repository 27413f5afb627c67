"""The LoRA support of a build, settled before any heavy work, and what its adapter cache costs in memory.

The modules adapters may target are those the ``--lora`` adapters adapt (their union, each adapter checked against
the base), or, without adapters, ``--lora-target-modules`` (PEFT's names or TensorRT-LLM's). An engine's LoRA
plugin (``trtllm-build --lora_target_modules``) and the llmapi target's ``LoraConfig`` are built for exactly these,
so an adapter added later may adapt only them. A build with neither has no LoRA support.

The cache holds ``max_loras`` adapters, each sized at the highest rank:
``Σ over layers and target modules of max_lora_rank × (in + out) × element bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.artifact import LoraRecord
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.runtime.lora_modules import TRTLLM_MODULES, module_shapes
from trtllm_kit.spec.tables import BuildOptions

ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def base_config(hf: HFConfig) -> dict[str, Any]:
    """The sizes ``module_shapes`` reads, from an HF config (as the checkpoint's ``config.json`` names them).

    Arguments:
        hf: the base model's config.
    """
    return {"architecture": hf.architecture, "hidden_size": hf.hidden_size,
            "num_attention_heads": hf.num_attention_heads, "num_key_value_heads": hf.num_key_value_heads,
            "head_size": hf.head_dim, "intermediate_size": hf.intermediate_size,
            "num_hidden_layers": hf.num_hidden_layers}


def lora_settings(build: BuildOptions, config: dict[str, Any]) -> LoraRecord | None:
    """The LoRA support of a build: from its adapters (each read and checked) or ``lora_target_modules``.

    Arguments:
        build: the ``[build]`` table; config: the base's sizes (``base_config``, or a checkpoint ``config.json``).
    """
    shapes = module_shapes(config)
    given = parse_modules(build.lora_target_modules, list(shapes)) if build.lora_target_modules else None
    if not build.lora:
        if given is None:
            return None
        return LoraRecord(target_modules=given, max_lora_rank=build.max_lora_rank, max_loras=build.max_loras)
    from trtllm_kit.lora.peft_adapter import read_adapter  # torch

    adapted: set[str] = set()
    for name, source in build.lora.items():
        modules = read_adapter(Path(source), config, build.max_lora_rank).target_modules
        outside = sorted(set(modules) - set(given or modules))
        if outside:
            raise KitUsageError(f"adapter {name} ({source}) adapts {', '.join(outside)}, which --lora-target-modules "
                                f"{build.lora_target_modules} leaves out; add them or drop --lora-target-modules.")
        adapted.update(modules)
    modules = given or [m for m in shapes if m in adapted]
    return LoraRecord(target_modules=modules, max_lora_rank=build.max_lora_rank, max_loras=build.max_loras)


def parse_modules(text: str, known: list[str]) -> list[str]:
    """``"q_proj,attn_v"`` → ``["q_proj", "v_proj"]``: PEFT names, in the family's order.

    Arguments:
        text: comma-separated PEFT or TensorRT-LLM module names; known: the family's PEFT modules, in order.
    """
    peft_of = {TRTLLM_MODULES[m][0]: m for m in known}
    chosen = set()
    for raw in (part.strip() for part in text.split(",")):
        module = raw if raw in known else peft_of.get(raw)
        if module is None:
            raise KitUsageError(f"--lora-target-modules names {raw!r}, which this model does not have; use "
                                f"{', '.join(known)} (or {', '.join(peft_of)}).")
        chosen.add(module)
    return [m for m in known if m in chosen]


def trtllm_modules(lora: LoraRecord) -> list[str]:
    """TensorRT-LLM's names of the target modules (``attn_q``, ``mlp_h_to_4h``, ...).

    Arguments:
        lora: the build's LoRA support.
    """
    return [TRTLLM_MODULES[m][0] for m in lora.target_modules]


@dataclass(frozen=True)
class LoraCache:
    """The adapter cache's memory: one adapter at the highest rank, times the adapters held."""

    adapter_bytes: int
    max_loras: int
    max_lora_rank: int
    dtype: str

    @property
    def total_bytes(self) -> int:
        return self.adapter_bytes * self.max_loras

    def to_dict(self) -> dict[str, Any]:
        return {"adapter_bytes": self.adapter_bytes, "max_loras": self.max_loras,
                "max_lora_rank": self.max_lora_rank, "dtype": self.dtype, "total_bytes": self.total_bytes}


def cache_memory(lora: LoraRecord, config: dict[str, Any], dtype: str) -> LoraCache:
    """What the adapter cache holds at most.

    Arguments:
        lora: the build's LoRA support; config: the base's sizes; dtype: the adapters' dtype (the model's).
    """
    shapes = module_shapes(config)
    per_layer = sum(fan_in + fan_out for fan_in, fan_out in (shapes[m] for m in lora.target_modules))
    adapter = int(config["num_hidden_layers"]) * lora.max_lora_rank * per_layer * ELEMENT_BYTES.get(dtype, 4)
    return LoraCache(adapter, lora.max_loras, lora.max_lora_rank, dtype)
