"""Checkpoints that arrive already quantized, recognised from their config: ModelOpt's unified format (FP8, NVFP4,
W4A16 AWQ; ``hf_quant_config.json`` or ``quantization_config.quant_method: modelopt`` in ``config.json``) and
llm-compressor's ``compressed-tensors`` FP8 (``quant_method: compressed-tensors``, 8-bit float weights).

The llmapi target serves them as they are (TensorRT-LLM's PyTorch backend reads both configs, docs/llmapi.md
§4.2): the build checks every quantized linear's tensors against the format and copies the files. Any other
``quantization_config`` is refused in one sentence, so that quantized weights are never read as plain ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import AWQ_GROUP_SIZE, AWQ_GROUP_SIZES

MODELOPT_ALGOS = ("FP8", "NVFP4", "W4A16_AWQ")
HF_QUANT_CONFIG = "hf_quant_config.json"
# per quantized linear: tensor suffix → dtype (None: float32 scale of any shape); shapes are checked against W
FORMAT_TENSORS: dict[str, dict[str, torch.dtype | None]] = {
    "FP8": {"weight": torch.float8_e4m3fn, "weight_scale": None},
    "NVFP4": {"weight": torch.uint8, "weight_scale": torch.float8_e4m3fn, "weight_scale_2": None},
    "W4A16_AWQ": {"weight": torch.uint8, "weight_scale": None},
}


@dataclass(frozen=True)
class PreQuantized:
    """What a pre-quantized checkpoint holds and where its config says so."""

    producer: str  # "modelopt" or "compressed-tensors"
    quant_algo: str
    kv_cache_quant_algo: str | None
    declared_in: str  # the file that declares it
    strategy: str = "tensor"  # compressed-tensors' weight scale granularity: tensor or channel
    group_size: int = AWQ_GROUP_SIZE  # W4A16 AWQ: input features per weight scale

    @property
    def label(self) -> str:
        """``ModelOpt unified FP8`` or ``compressed-tensors FP8 (per-tensor)``."""
        if self.producer == "modelopt":
            return f"ModelOpt unified {self.quant_algo}"
        return f"compressed-tensors {self.quant_algo} (per-{self.strategy})"


def detect_prequantized(model_dir: Path) -> PreQuantized | None:
    """The pre-quantized format of ``model_dir`` (None: plain weights); refuses a quantization the kit cannot take.

    Arguments:
        model_dir: an HF model directory.
    """
    quant_file = model_dir / HF_QUANT_CONFIG
    if quant_file.is_file():
        block = json.loads(quant_file.read_text()).get("quantization") or {}
        return _modelopt(model_dir, block.get("quant_algo"), block.get("kv_cache_quant_algo"), HF_QUANT_CONFIG,
                         block.get("group_size"))
    inline = json.loads((model_dir / "config.json").read_text()).get("quantization_config")
    if not inline:
        return None
    method = str(inline.get("quant_method", ""))
    if method.startswith("modelopt"):
        kv = "FP8" if (inline.get("kv_cache_scheme") or {}).get("num_bits") == 8 else None
        return _modelopt(model_dir, inline.get("quant_algo"), kv, "config.json", inline.get("group_size"))
    if method == "compressed-tensors":
        return _compressed_tensors(model_dir, inline)
    raise KitUsageError(f"{model_dir} is quantized with quant_method {method!r} (config.json), which the kit does "
                        "not take as input; start from the unquantized model, or from a ModelOpt unified "
                        "(FP8, NVFP4, W4A16 AWQ) or compressed-tensors FP8 checkpoint.")


def _modelopt(model_dir: Path, algo: Any, kv: Any, declared_in: str, group_size: Any) -> PreQuantized:
    if algo not in MODELOPT_ALGOS or kv not in (None, "FP8"):
        raise KitUsageError(f"{model_dir}/{declared_in} declares quant_algo {algo} with kv_cache_quant_algo {kv}; "
                            f"the kit takes ModelOpt checkpoints of {', '.join(MODELOPT_ALGOS)} with an FP8 or "
                            "unquantized KV cache: start from the unquantized model instead.")
    if algo != "W4A16_AWQ":
        return PreQuantized("modelopt", str(algo), kv, declared_in)
    group = AWQ_GROUP_SIZE if group_size is None else group_size
    if group not in AWQ_GROUP_SIZES or isinstance(group, bool):
        raise KitUsageError(f"{model_dir}/{declared_in} declares W4A16 AWQ with group_size {group_size!r}; the kit "
                            f"takes groups of {' or '.join(map(str, AWQ_GROUP_SIZES))} (those TensorRT-LLM's kernels "
                            "run): export it again with one of them.")
    return PreQuantized("modelopt", str(algo), kv, declared_in, group_size=group)


def _compressed_tensors(model_dir: Path, inline: dict[str, Any]) -> PreQuantized:
    groups = list((inline.get("config_groups") or {}).values())
    weights = [g.get("weights") or {} for g in groups]
    strategies = {w.get("strategy", "tensor") for w in weights}
    is_fp8 = bool(weights) and all(w.get("num_bits") == 8 and w.get("type") == "float" for w in weights)
    if not is_fp8 or len(strategies) != 1 or not strategies <= {"tensor", "channel"} \
            or inline.get("format") not in (None, "float-quantized", "naive-quantized"):
        raise KitUsageError(f"{model_dir}/config.json declares a compressed-tensors scheme other than FP8 weights "
                            f"with per-tensor or per-channel scales (found {weights or 'no config_groups'}); the kit "
                            "takes compressed-tensors FP8 only: start from the unquantized model instead.")
    kv = "FP8" if (inline.get("kv_cache_scheme") or {}).get("num_bits") == 8 else None
    return PreQuantized("compressed-tensors", "FP8", kv, "config.json", strategies.pop())


def check_prequantized(fmt: PreQuantized, tensors: dict[str, Any], linear_weights: list[str]) -> None:
    """Refuse a checkpoint whose quantized linears lack a tensor of the format or hold one of another dtype.

    Arguments:
        fmt: the detected format; tensors: name → ``TensorInfo`` (dtype, shape) of the checkpoint;
        linear_weights: the ``.weight`` names of the linears the format quantizes.
    """
    for weight in linear_weights:
        module = weight.removesuffix(".weight")
        for suffix, dtype in FORMAT_TENSORS[fmt.quant_algo].items():
            info = tensors.get(f"{module}.{suffix}")
            found = None if info is None else info.dtype
            if info is None or (dtype is not None and found != dtype) or (dtype is None and found != torch.float32):
                want = dtype or torch.float32
                raise KitUsageError(f"the {fmt.label} checkpoint has {module}.{suffix} as {found or 'missing'} where "
                                    f"the format needs {str(want).removeprefix('torch.')}; it is incomplete or not "
                                    "what its config declares: export it again.")
