"""A PEFT LoRA adapter directory, read and checked against the base checkpoint it is meant for.

The checks follow what TensorRT-LLM's loaders accept: a plain LoRA (no DoRA, no bias, no per-module rank or alpha
patterns, no ``modules_to_save`` that would replace base weights) on the attention and MLP linears the family has,
with the shapes of the base, a rank no higher than the artifact's ``max_lora_rank`` and finite weights. Its files
are read with the bounds of ``adapter_files.py``. Each refusal is one sentence naming what was found.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.lora.adapter_files import read_config, read_weights, weights_bound
from trtllm_kit.runtime.lora_modules import FUSED_GATE_UP, module_shapes

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_NAME = "adapter_model.bin"
KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class AdapterError(KitUsageError):
    """A LoRA adapter the artifact cannot take."""


@dataclass(frozen=True)
class PeftAdapter:
    """A checked adapter: its hyperparameters, the base model it records, per (layer, module) the pair (A ``[r, in]``,
    B ``[out, r]``), and the bytes of its two files as they were checked."""

    path: Path
    rank: int
    alpha: float
    scale: float  # alpha / r, or alpha / sqrt(r) with use_rslora
    target_modules: list[str]
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    base_model: str | None  # adapter_config.json's base_model_name_or_path
    config_bytes: bytes
    weights_bytes: bytes

    def converted(self, dtype: torch.dtype) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
        """The pairs as TensorRT-LLM's loaders convert them, in ``dtype``: the scale multiplied into B, and a fused
        ``gate_up_proj`` B's halves swapped (HF stacks ``[gate; up]``, the checkpoint's swiglu ``fc`` is
        ``[up; gate]``).

        Arguments:
            dtype: the target's weight dtype.
        """
        pairs = {}
        for (layer, module), (a, b) in self.pairs.items():
            if module == FUSED_GATE_UP:
                b = torch.cat(b.chunk(2)[::-1])
            scaled = (b.to(torch.float32) * self.scale).to(dtype)
            if not torch.isfinite(scaled).all():
                raise AdapterError(f"{self.path} has lora_B values for layer {layer} {module} that are not finite in "
                                   f"{str(dtype).removeprefix('torch.')} once scaled by {self.scale:g}; train or "
                                   "save the adapter again with smaller weights or lora_alpha.")
            pairs[(layer, module)] = (a.to(torch.float32).to(dtype).contiguous(), scaled.contiguous())
        return pairs


def read_adapter(path: Path, base: dict[str, Any], max_lora_rank: int) -> PeftAdapter:
    """Read the PEFT adapter at ``path`` and check it against the base checkpoint's ``config.json``.

    Arguments:
        path: a directory holding adapter_config.json and adapter_model.safetensors;
        base: the artifact's checkpoint config; max_lora_rank: the artifact's highest adapter rank.
    """
    config_bytes, config = _read_config(path)
    rank, alpha = _hyperparameters(path, config)
    if rank > max_lora_rank:
        raise AdapterError(f"{path} has rank {rank}, above the artifact's max_lora_rank {max_lora_rank}; rebuild "
                           f"with --max-lora-rank {rank} or retrain the adapter with r <= {max_lora_rank}.")
    shapes = module_shapes(base)
    weights = path / WEIGHTS_NAME
    if not weights.exists():
        raise AdapterError(f"{path} has no {WEIGHTS_NAME}; save the adapter with PEFT's save_pretrained.")
    weights_bytes, tensors = read_weights(weights, weights_bound(base, rank))
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = KEY.fullmatch(name)
        if match is None:
            raise AdapterError(f"{path / WEIGHTS_NAME} holds {name:.200}, which is not a LoRA A/B weight of a decoder "
                               "layer's linear; the kit takes plain LoRA adapters (no bias, DoRA or saved modules).")
        layer, module, side = int(match[1]), match[2], match[3]
        if module not in shapes:
            raise AdapterError(f"{path} targets {module}, which the base family {base.get('architecture')} does "
                               f"not have (it has {', '.join(shapes)}); the adapter was trained for another model.")
        if layer >= int(base["num_hidden_layers"]):
            raise AdapterError(f"{path} adapts layer {layer}, but the base has {base['num_hidden_layers']} layers; "
                               "the adapter was trained for another model.")
        if tensor.dtype not in FLOAT_DTYPES:
            raise AdapterError(f"{name} in {path / WEIGHTS_NAME} is {tensor.dtype}; LoRA weights must be float16, "
                               "bfloat16 or float32.")
        if not torch.isfinite(tensor).all():
            raise AdapterError(f"{name} in {path / WEIGHTS_NAME} holds NaN or infinite values; the adapter is "
                               "broken: train or save it again.")
        fan_in, fan_out = shapes[module]
        want = (rank, fan_in) if side == "A" else (fan_out, rank)
        if tuple(tensor.shape) != want:
            raise AdapterError(f"{name} in {path / WEIGHTS_NAME} has shape {list(tensor.shape)}, but rank {rank} on "
                               f"this base needs {list(want)}; the adapter was trained for another model.")
        pairs.setdefault((layer, module), {})[side] = tensor
    for (layer, module), sides in pairs.items():
        if set(sides) != {"A", "B"}:
            raise AdapterError(f"{path / WEIGHTS_NAME} has only lora_{''.join(sides)} for layer {layer} {module}; "
                               "save the adapter again with PEFT.")
    if not pairs:
        raise AdapterError(f"{path / WEIGHTS_NAME} holds no LoRA weights; save the adapter again with PEFT.")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return PeftAdapter(path=path, rank=rank, alpha=alpha, scale=scale,
                       target_modules=sorted({m for _, m in pairs}),
                       pairs={k: (v["A"], v["B"]) for k, v in sorted(pairs.items())},
                       base_model=config.get("base_model_name_or_path"), config_bytes=config_bytes,
                       weights_bytes=weights_bytes)


def _read_config(path: Path) -> tuple[bytes, dict[str, Any]]:
    try:
        is_dir = path.is_dir()
    except (OSError, ValueError):
        is_dir = False
    if not is_dir:
        raise AdapterError(f"{str(path)[:300]} is not a directory; pass a PEFT adapter directory (save_pretrained's "
                           "output).")
    if (path / PICKLE_NAME).exists() and not (path / WEIGHTS_NAME).exists():
        raise AdapterError(f"{path} holds {PICKLE_NAME}, a pickle, which the kit never loads; save the adapter with "
                           "safe_serialization=True (adapter_model.safetensors).")
    if not (path / CONFIG_NAME).exists():
        raise AdapterError(f"{path} has no {CONFIG_NAME}; pass a PEFT LoRA adapter directory.")
    raw = read_config(path / CONFIG_NAME)
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise AdapterError(f"{path / CONFIG_NAME} is not JSON ({type(exc).__name__}); pass a PEFT LoRA adapter "
                           "directory.") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        found = config.get("peft_type") if isinstance(config, dict) else config
        raise AdapterError(f"{path / CONFIG_NAME} has peft_type {found!r:.80}; the kit takes LORA adapters.")
    refusals = (("modules_to_save", "replaces base weights for every request"), ("use_dora", "is DoRA"),
                ("rank_pattern", "sets per-module ranks"), ("alpha_pattern", "sets per-module alphas"),
                ("fan_in_fan_out", "stores transposed weights"))
    for key, why in refusals:
        if config.get(key):
            raise AdapterError(f"{path / CONFIG_NAME} sets {key} ({config[key]!r:.80}), which {why}; the kit takes "
                               f"plain LoRA adapters: retrain without {key}.")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path / CONFIG_NAME} has bias {config['bias']!r:.80}; the kit takes adapters with bias "
                           "'none'.")
    base = config.get("base_model_name_or_path")
    if base is not None and not isinstance(base, str):
        raise AdapterError(f"{path / CONFIG_NAME} has base_model_name_or_path {base!r:.80}, which is not a string; "
                           "save the adapter again with PEFT.")
    return raw, config


def _hyperparameters(path: Path, config: dict[str, Any]) -> tuple[int, float]:
    """``r`` (a whole number of at least 1) and ``lora_alpha`` (a finite number), PEFT's 8 where absent."""
    rank, alpha = config.get("r", 8), config.get("lora_alpha", 8)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(f"{path / CONFIG_NAME} has r {rank!r:.80}; a LoRA rank is a whole number of at least 1: "
                           "save the adapter again with PEFT.")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterError(f"{path / CONFIG_NAME} has lora_alpha {alpha!r:.80}; it must be a finite number: save the "
                           "adapter again with PEFT.")
    return rank, float(alpha)
