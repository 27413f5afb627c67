"""The tensors of each output shard of the unified checkpoint export, planned before any byte is read: one shard
per input weight file, each HF tensor kept, cast, or quantized into the entries its format stores (FP8, NVFP4,
W4A16 AWQ through ``awq_entries.py``) and the FP8 KV cache's ``k_scale`` / ``v_scale``."""

from __future__ import annotations

from pathlib import Path

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.awq_entries import AWQ_NORM, awq_entries
from trtllm_kit.llmapi.entry import Entry
from trtllm_kit.llmapi.quant_format import KV_SCALES, LAYER_LINEAR, NVFP4_GROUP_SIZE
from trtllm_kit.models.inspect import ModelSpec
from trtllm_kit.quant.algos import QuantConfig

F32 = torch.float32


def shard_names(count: int) -> list[str]:
    """``model-00001-of-0000N.safetensors`` for each output shard.

    Arguments:
        count: the number of shards.
    """
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def plan_entries(model: ModelSpec, dtype: torch.dtype, quant: QuantConfig) -> list[list[Entry]]:
    """The tensors of each output shard (one per input weight file, in its order).

    Arguments:
        model: the inspected HF model; dtype: the checkpoint dtype; quant: the quantization.
    """
    ignored = {pattern.format(layer) for pattern in model.family.ignored
               for layer in range(model.hf.num_hidden_layers)}
    by_file: dict[Path, list[Entry]] = {path: [] for path in model.weight_files}
    for name, info in model.tensors.items():
        if name in ignored:
            continue
        entries = by_file[info.path]
        linear = LAYER_LINEAR.match(name) if quant.quant_algo in ("FP8", "NVFP4", "W4A16_AWQ") else None
        if linear is None and quant.quant_algo == "W4A16_AWQ" and AWQ_NORM.match(name):
            entries.append(Entry(name, dtype, info.shape, name, "awq_norm"))
        elif linear is None:
            keep = info.dtype if not info.dtype.is_floating_point else dtype
            entries.append(Entry(name, keep, info.shape, name, "copy"))
        elif quant.quant_algo == "W4A16_AWQ":
            entries += awq_entries(name, linear.group(1), info.shape, dtype, quant.awq_group_size)
        elif quant.quant_algo == "FP8":
            module = linear.group(1)
            entries += [Entry(name, torch.float8_e4m3fn, info.shape, name, "fp8"),
                        Entry(f"{module}.weight_scale", F32, (), name, "weight_scale"),
                        Entry(f"{module}.input_scale", F32, (), name, "input_scale")]
        else:
            module, (rows, cols) = linear.group(1), info.shape
            if cols % NVFP4_GROUP_SIZE:
                raise KitUsageError(f"--quant nvfp4 quantizes blocks of {NVFP4_GROUP_SIZE} input features, but {name} "
                                    f"has {cols}; choose --quant fp8 for this model.")
            entries += [Entry(name, torch.uint8, (rows, cols // 2), name, "nvfp4"),
                        Entry(f"{module}.weight_scale", torch.float8_e4m3fn, (rows, cols // NVFP4_GROUP_SIZE), name,
                              "block_scale"),
                        Entry(f"{module}.weight_scale_2", F32, (), name, "weight_scale_2"),
                        Entry(f"{module}.input_scale", F32, (), name, "nvfp4_input_scale")]
        proj = name.removesuffix(".weight").rsplit(".", 1)[-1]
        if quant.kv_cache_quant_algo == "FP8" and name.endswith(".weight") and proj in KV_SCALES \
                and ".self_attn." in name:
            module = name.removesuffix(".weight")
            entries.append(Entry(f"{module}.{KV_SCALES[proj]}", F32, (), name, KV_SCALES[proj]))
        if quant.kv_cache_quant_algo == "FP8" and name.endswith(".self_attn.qkv_proj.weight"):
            # Phi-3's fused projection: the scales under the unfused names, from the k and v rows of its output
            attn, hf = name.removesuffix(".qkv_proj.weight"), model.hf
            q_rows, kv_rows = hf.num_attention_heads * hf.head_dim, hf.num_key_value_heads * hf.head_dim
            entries += [Entry(f"{attn}.k_proj.k_scale", F32, (), name, "k_scale", (q_rows, q_rows + kv_rows)),
                        Entry(f"{attn}.v_proj.v_scale", F32, (), name, "v_scale",
                              (q_rows + kv_rows, q_rows + 2 * kv_rows))]
    return [by_file[path] for path in model.weight_files]
