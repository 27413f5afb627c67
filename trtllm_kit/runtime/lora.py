"""LoRA adapters in the CPU runtime's form: per (layer, PEFT module) the pair A ``[r, in]`` and B ``[out, r]``,
with PEFT's scale (alpha / r) already multiplied into B, as TensorRT-LLM's converted adapters carry it; the
runtime adds ``(x @ A^T) @ B^T`` to the module's output and never scales.

``module_shapes`` is the one statement of which PEFT modules a checkpoint's family has and their (in, out) sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from trtllm_kit.errors import KitUsageError

ADAPTER_FILE = "adapter.safetensors"  # the converted adapter, in OUT/lora/NAME/
FUSED_FAMILIES = ("Phi3ForCausalLM",)  # HF fuses qkv_proj and gate_up_proj

Pair = tuple[torch.Tensor, torch.Tensor]  # (A [r, in], B [out, r] scaled)


def module_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The PEFT module names of the checkpoint's family and their (in, out) sizes, unsharded.

    Arguments:
        config: a TensorRT-LLM checkpoint ``config.json``.
    """
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_size = int(config.get("head_size") or hidden // heads)
    inter = int(config["intermediate_size"])
    q, kv = heads * head_size, kv_heads * head_size
    if config.get("architecture") in FUSED_FAMILIES:
        return {"qkv_proj": (hidden, q + 2 * kv), "o_proj": (q, hidden), "gate_up_proj": (hidden, 2 * inter),
                "down_proj": (inter, hidden)}
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def tensor_names(layer: int, module: str) -> tuple[str, str]:
    """The converted file's names of A and B for a layer's module."""
    return f"layers.{layer}.{module}.lora_A", f"layers.{layer}.{module}.lora_B"


def load_adapter(path: Path, dtype: torch.dtype) -> dict[tuple[int, str], Pair]:
    """Read a converted adapter file into its (layer, module) → (A, B) pairs in the compute dtype.

    Arguments:
        path: ``OUT/lora/NAME/adapter.safetensors``; dtype: the runtime's compute dtype.
    """
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError) as exc:
        raise KitUsageError(f"{path} cannot be read as a converted LoRA adapter ({exc}); add the adapter again "
                            "(trtllm-kit lora add).") from None
    pairs: dict[tuple[int, str], Pair] = {}
    for name in tensors:
        if name.endswith(".lora_A"):
            _, layer, module, _ = name.split(".")
            a_name, b_name = tensor_names(int(layer), module)
            pairs[(int(layer), module)] = (tensors[a_name].to(dtype), tensors[b_name].to(dtype))
    return pairs


def delta(x: torch.Tensor, pair: Pair) -> torch.Tensor:
    """The LoRA term ``(x @ A^T) @ B^T`` of one module (the scale is in B).

    Arguments:
        x: the module's input [..., in]; pair: (A, B).
    """
    a, b = pair
    return torch.nn.functional.linear(torch.nn.functional.linear(x, a), b)
