"""Quantization of the unified checkpoint: which ``--quant``/``--kv-cache`` the PyTorch backend can load, the
per-linear FP8 scales and NVFP4's fused groups (ModelOpt's unified format), and the two places the format is declared:
``hf_quant_config.json`` (nested shape, read first by TensorRT-LLM) and ``quantization_config`` in
``config.json`` (ModelOpt's flat inline shape). docs/llmapi-confirmed.md cites the upstream sources.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import torch

from trtllm_kit import __version__
from trtllm_kit.errors import KitUsageError
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.fp8 import FP8_MAX

BLOCK_ELEMENTS = 1 << 18  # 512 KiB of bf16 per block: the division, the sum and the cast stay in cache

PRODUCER = "trtllm-kit"
QUANT_CONFIG_FILE = "hf_quant_config.json"
# the HF linears the formats quantize (per decoder layer; Phi-3's fused qkv_proj and gate_up_proj are one linear
# each); lm_head and every embedding stay unquantized
LAYER_LINEAR = re.compile(r"^(model\.layers\.\d+\.(?:self_attn\.(?:[qkvo]|qkv)_proj"
                          r"|mlp\.(?:gate|up|down|gate_up)_proj))\.weight$")
# linears that read one input, which the backend fuses into one GEMM: NVFP4 gives them one weight_scale_2 and one
# input_scale (the largest amax of the group), as ModelOpt's export does; FP8 keeps a scale per linear
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
NVFP4_GROUP_SIZE = 16
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


def fused_group(module: str) -> list[str]:
    """The HF linears fused with ``module`` (itself included), e.g. q/k/v of its layer.

    Arguments:
        module: an HF linear name (``model.layers.0.self_attn.k_proj``).
    """
    parent, _, leaf = module.rpartition(".")
    group = next((g for g in FUSED_GROUPS if leaf in g), (leaf,))
    return [f"{parent}.{name}" for name in group]


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


BlockSink = Callable[[int, torch.Tensor], None]  # (first row, e4m3 rows) → None: write them out


def quantize_weight(weight: torch.Tensor, scale: torch.Tensor, pool: Executor | None = None,
                    workers: int = 1, sink: BlockSink | None = None) -> tuple[torch.Tensor, bool]:
    """``(W / scale)`` in W's dtype, clamped to ±448 and cast to e4m3: ModelOpt's arithmetic (the division of a
    bf16 tensor by a float32 scalar computes in float32 and rounds once to bf16), so the bytes are the same.
    Rows are split into ``workers`` ranges run on ``pool`` (torch releases the GIL), each a cache-sized block at a
    time through one scratch buffer; ``scale`` is ``amax/448``, so the clamp only guards against a stale scale.

    Returns the e4m3 tensor and whether every divided value was finite (a False sends the caller to the exact
    NaN/Inf check of the source; it costs one in-cache min/max per block instead of a second pass over the
    weight).

    Arguments:
        weight: the [out, in] weight in the checkpoint dtype; scale: its float32 scalar ``weight_scale``;
        pool: threads for the row ranges (None: the calling thread); workers: how many ranges; sink: called on
        the block's thread with each quantized block while it is still in cache (the export writes it there).
    """
    out = torch.empty(weight.shape, dtype=torch.float8_e4m3fn)
    src = weight.reshape(1, -1) if weight.dim() < 2 else weight.reshape(weight.shape[0], -1)
    dst = out.view(src.shape)
    rows, cols = src.shape
    per_block = max(1, BLOCK_ELEMENTS // max(1, cols))
    starts = list(range(0, rows, per_block))

    def run(chunk: list[int]) -> bool:
        scratch = torch.empty((min(rows, per_block), cols), dtype=weight.dtype)
        finite = True
        for start in chunk:
            stop = min(rows, start + per_block)
            block = scratch[: stop - start]
            torch.div(src[start:stop], scale, out=block)
            low, high = (float(v) for v in torch.aminmax(block))  # NaN propagates; a third of a clamp's cost
            finite = finite and math.isfinite(low) and math.isfinite(high)
            if not -FP8_MAX <= low <= high <= FP8_MAX:
                block.clamp_(-FP8_MAX, FP8_MAX)
            dst[start:stop].copy_(block)
            if sink is not None:
                sink(start, dst[start:stop])
        return finite

    count = max(1, min(workers, len(starts) // 4)) if pool is not None else 1
    if count == 1:
        return out, run(starts)
    size = -(-len(starts) // count)
    futures = [pool.submit(run, starts[i:i + size]) for i in range(0, len(starts), size)]  # type: ignore[union-attr]
    return out, all([future.result() for future in futures])


def hf_quant_config(config: QuantConfig) -> dict[str, Any]:
    """``hf_quant_config.json``: the nested shape TensorRT-LLM's ``ModelConfig.from_pretrained`` reads first.

    Arguments:
        config: the build's quantization (already checked by ``check_llmapi_quant``).
    """
    quantization: dict[str, Any] = {"quant_algo": config.quant_algo, "kv_cache_quant_algo": config.kv_cache_quant_algo}
    if config.quant_algo == "NVFP4":
        quantization["group_size"] = NVFP4_GROUP_SIZE
    if config.quant_algo == "W4A16_AWQ":
        quantization.update({"group_size": config.awq_group_size, "has_zero_point": False, "pre_quant_scale": True})
    quantization["exclude_modules"] = list(EXCLUDED_MODULES) if config.quant_algo else None
    return {"producer": {"name": PRODUCER, "version": __version__}, "quantization": quantization}


def inline_quantization_config(config: QuantConfig) -> dict[str, Any]:
    """``config.json``'s ``quantization_config``: ModelOpt's flat inline shape (``quant_method: modelopt``).

    Arguments:
        config: the build's quantization.
    """
    fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    scheme = fp8 if config.quant_algo == "FP8" else {"dynamic": False, "num_bits": 4, "type": "float",
                                                      "group_size": NVFP4_GROUP_SIZE}
    inline: dict[str, Any] = {}
    if config.quant_algo == "W4A16_AWQ":  # ModelOpt writes no config_groups for it
        inline["ignore"] = list(EXCLUDED_MODULES)
    elif config.quant_algo:
        inline["config_groups"] = {"group_0": {"input_activations": dict(scheme), "weights": dict(scheme),
                                               "targets": ["Linear"]}}
        inline["ignore"] = list(EXCLUDED_MODULES)
    inline["quant_algo"] = config.quant_algo
    if config.kv_cache_quant_algo == "FP8":
        inline["kv_cache_scheme"] = dict(fp8)
    inline["producer"] = {"name": PRODUCER, "version": __version__}
    inline["quant_method"] = "modelopt"
    return inline
