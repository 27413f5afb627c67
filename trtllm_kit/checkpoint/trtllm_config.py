"""The TensorRT-LLM checkpoint ``config.json``: only keys every release from 0.12 to 1.2.1 reads."""

from __future__ import annotations

from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.precision import Precision
from trtllm_kit.spec import BuildSpec

DTYPES = ("float16", "bfloat16", "float32")


def resolve_dtype(requested: str, hf: HFConfig) -> str:
    """``auto`` takes the HF dtype, with float32 mapped to float16 as TensorRT-LLM does.

    Arguments:
        requested: ``auto`` or one of ``DTYPES``.
        hf: the model config.
    """
    if requested == "auto":
        return "float16" if hf.dtype == "float32" else hf.dtype
    if requested not in DTYPES:
        raise KitUsageError(f"dtype {requested!r} is not one of auto, {', '.join(DTYPES)}.")
    return requested


def default_quantization() -> dict[str, Any]:
    return {"quant_algo": None, "kv_cache_quant_algo": None, "group_size": 128,
            "has_zero_point": False, "pre_quant_scale": False, "exclude_modules": None}


def checkpoint_config(hf: HFConfig, family: Family, mapping: Mapping, dtype: str,
                      quantization: dict[str, Any] | None = None) -> dict[str, Any]:
    """The checkpoint ``config.json`` for a model, layout and dtype.

    Arguments:
        hf: the model config.
        family: its family (adds family keys such as ``qwen_type``).
        mapping: the TP/PP layout.
        dtype: the resolved checkpoint dtype.
        quantization: the ``quantization`` object; unquantized when omitted.
    """
    config: dict[str, Any] = {
        "architecture": hf.architecture or family.architectures[0],
        "dtype": dtype,
        "logits_dtype": "float32",
        "vocab_size": hf.vocab_size,
        "max_position_embeddings": hf.max_position_embeddings,
        "hidden_size": hf.hidden_size,
        "num_hidden_layers": hf.num_hidden_layers,
        "num_attention_heads": hf.num_attention_heads,
        "num_key_value_heads": hf.num_key_value_heads,
        "head_size": hf.head_dim,
        "hidden_act": hf.hidden_act,
        "intermediate_size": hf.intermediate_size,
        "norm_epsilon": hf.rms_norm_eps,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": hf.rope_theta,
        "rotary_scaling": hf.rope_scaling,
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
    }
    config.update(family.extra_config(hf))
    config["mapping"] = mapping.to_dict()
    config["quantization"] = quantization or default_quantization()
    return config


def precision_of(spec: BuildSpec, hf: HFConfig) -> Precision:
    """The checkpoint dtype and quantization a spec asks for, or a pre-quantized input holds: the one place the
    engine stage reads them.

    Arguments:
        spec: the build spec.
        hf: the model config (``auto`` dtype).
    """
    from trtllm_kit.models.inspect import resolve_model_path
    from trtllm_kit.quant.prequantized import detect_prequantized  # torch

    dtype = resolve_dtype(spec.build.dtype, hf)
    fmt = detect_prequantized(resolve_model_path(spec.model))
    if fmt is not None:
        return Precision(dtype, fmt.quant_algo, fmt.kv_cache_quant_algo)
    quant = spec.quant_config()
    return Precision(dtype, quant.quant_algo, quant.kv_cache_quant_algo)
