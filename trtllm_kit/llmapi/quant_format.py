"""Quantization of the unified checkpoint: which ``--quant``/``--kv-cache`` the PyTorch backend can load, the
per-linear FP8 scales (ModelOpt's unified format), and the two places the format is declared:
``hf_quant_config.json`` (nested shape, read first by TensorRT-LLM) and ``quantization_config`` in
``config.json`` (ModelOpt's flat inline shape). docs/llmapi-confirmed.md cites the upstream sources.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from trtllm_kit import __version__
from trtllm_kit.errors import KitUsageError
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.fp8 import FP8_MAX

PRODUCER = "trtllm-kit"
QUANT_CONFIG_FILE = "hf_quant_config.json"
# the HF linears the FP8 format quantizes (per decoder layer); lm_head and every embedding stay unquantized
LAYER_LINEAR = re.compile(r"^(model\.layers\.\d+\.(?:self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj))\.weight$")
EXCLUDED_MODULES = ("lm_head", "model.embed_tokens")  # sorted, as ModelOpt lists them
KV_SCALES = {"k_proj": "k_scale", "v_proj": "v_scale"}
REFUSED = {
    "int8-sq": "--quant int8-sq is refused for --target llmapi because TensorRT-LLM's PyTorch backend has no "
               "W8A8 INT8 (SmoothQuant) linear method; use --quant fp8 (Ada/Hopper/Blackwell) or --quant none here, "
               "or --target engine for SmoothQuant.",
    "int8-wo": "--quant int8-wo is refused for --target llmapi because the PyTorch backend's INT8 weight-only "
               "loader is not confirmed for TensorRT-LLM 1.2.1 and not in its quantization support matrix; use "
               "--quant fp8 or --quant none here, or --target engine for W8A16.",
}
KV_REFUSED = ("--kv-cache int8 is refused for --target llmapi because the PyTorch backend has no INT8 KV cache; "
              "use --kv-cache fp8 or auto here, or --target engine for an INT8 KV cache.")


def check_llmapi_quant(config: QuantConfig) -> None:
    """Refuse a quantization the PyTorch backend cannot load, in one sentence naming the alternatives.

    Arguments:
        config: the build's quantization.
    """
    if config.quant in REFUSED:
        raise KitUsageError(REFUSED[config.quant])
    if config.kv_cache == "int8":
        raise KitUsageError(KV_REFUSED)


def weight_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """A linear's ``weight_scale``: ``amax / 448`` divided in double precision, then a float32 scalar (as
    ModelOpt's FP8 export computes it, so the scales and e4m3 bytes are the same).

    Arguments:
        amax: the weight's largest absolute value.
    """
    return torch.tensor(float(amax) / FP8_MAX, dtype=torch.float32)


def activation_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """``input_scale``, ``k_scale`` or ``v_scale``: ``amax / 448`` divided in float32 (ModelOpt's
    ``get_scaling_factor``), a float32 scalar.

    Arguments:
        amax: the calibrated largest absolute value.
    """
    return (torch.as_tensor(amax, dtype=torch.float32) / FP8_MAX).reshape(())


def quantize_weight(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(W / scale)`` in W's dtype, cast to e4m3 (ModelOpt's arithmetic, a block of rows at a time); ``scale``
    is ``amax/448``, so no element exceeds 448 (the clamp only guards against rounding).

    Arguments:
        weight: the [out, in] weight in the checkpoint dtype; scale: its float32 scalar ``weight_scale``.
    """
    out = torch.empty(weight.shape, dtype=torch.float8_e4m3fn)
    rows = max(1, (1 << 22) // max(1, weight.shape[-1]))
    for start in range(0, weight.shape[0], rows):
        block = weight[start:start + rows] / scale
        out[start:start + rows] = block.clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return out


def hf_quant_config(config: QuantConfig) -> dict[str, Any]:
    """``hf_quant_config.json``: the nested shape TensorRT-LLM's ``ModelConfig.from_pretrained`` reads first.

    Arguments:
        config: the build's quantization (already checked by ``check_llmapi_quant``).
    """
    return {"producer": {"name": PRODUCER, "version": __version__},
            "quantization": {"quant_algo": config.quant_algo, "kv_cache_quant_algo": config.kv_cache_quant_algo,
                             "exclude_modules": list(EXCLUDED_MODULES) if config.quant_algo else None}}


def inline_quantization_config(config: QuantConfig) -> dict[str, Any]:
    """``config.json``'s ``quantization_config``: ModelOpt's flat inline shape (``quant_method: modelopt``).

    Arguments:
        config: the build's quantization.
    """
    fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    inline: dict[str, Any] = {}
    if config.quant_algo:
        inline["config_groups"] = {"group_0": {"input_activations": dict(fp8), "weights": dict(fp8),
                                               "targets": ["Linear"]}}
        inline["ignore"] = list(EXCLUDED_MODULES)
    inline["quant_algo"] = config.quant_algo
    if config.kv_cache_quant_algo == "FP8":
        inline["kv_cache_scheme"] = dict(fp8)
    inline["producer"] = {"name": PRODUCER, "version": __version__}
    inline["quant_method"] = "modelopt"
    return inline
