"""KV-cache scales (``docs/trtllm-checkpoint.md`` §5.6): ``attention.kv_cache_scaling_factor``, float32 ``[1]``, a
dequantization scale.

* INT8 follows TensorRT-LLM's own converter (the legacy rule that goes with the SmoothQuant plugin flavour):
  amax over the whole q/k/v projection output during calibration, / 127. Taking q's range too leaves headroom
  for the rotary embedding, which can grow a key element by up to √2 after the hook saw it.
* FP8 follows ModelOpt: max(amax of k_proj, amax of v_proj) / 448, clamped to at least 1.0.

Only ``kv_cache_scaling_factor`` is written; releases that predate ``kv_cache_rcp_scaling_factor`` reject it.
"""

from __future__ import annotations

import torch

from trtllm_kit.quant.fp8 import FP8_MAX, fp8_round_trip
from trtllm_kit.quant.int8 import INT8_MAX


def int8_kv_scale(qkv_amax: float) -> float:
    """``max |q, k, v projection output| / 127``.

    Arguments:
        qkv_amax: the calibrated amax over the fused q/k/v outputs.
    """
    return max(float(qkv_amax), 1e-12) / INT8_MAX


def fp8_kv_scale(k_amax: float, v_amax: float) -> float:
    """``max(max(k, v) / 448, 1.0)``.

    Arguments:
        k_amax: calibrated amax of the k_proj output; v_amax: of the v_proj output.
    """
    return fp8_kv_scale_of(float(k_amax) / FP8_MAX, float(v_amax) / FP8_MAX)  # max commutes with / 448 exactly


def fp8_kv_scale_of(k_scale: float, v_scale: float) -> float:
    """The same rule over a pre-quantized checkpoint's ``k_scale`` and ``v_scale`` (``amax / 448`` each):
    ``max(k_scale, v_scale, 1.0)``.

    Arguments:
        k_scale: the layer's key scale; v_scale: its value scale.
    """
    return max(float(k_scale), float(v_scale), 1.0)


def kv_scale_tensor(scale: float) -> torch.Tensor:
    """The float32 ``[1]`` tensor written as ``kv_cache_scaling_factor``.

    Arguments:
        scale: the dequantization scale.
    """
    return torch.tensor([scale], dtype=torch.float32)


def kv_round_trip(x: torch.Tensor, scale: torch.Tensor | float, algo: str) -> torch.Tensor:
    """Store ``x`` in the quantized cache and read it back, in ``x``'s dtype: what attention then sees.

    Arguments:
        x: keys or values; scale: ``kv_cache_scaling_factor``; algo: ``INT8`` or ``FP8``.
    """
    if algo == "INT8":
        return ((x.float() / scale).round().clamp(-128, 127) * scale).to(x.dtype)
    if algo == "FP8":
        return fp8_round_trip(x, scale).to(x.dtype)
    raise ValueError(f"unknown KV cache algorithm {algo!r}")
