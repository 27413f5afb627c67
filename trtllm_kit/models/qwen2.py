"""Qwen2: Llama's names plus q/k/v biases; ``qwen_type`` is required by TensorRT-LLM's QWen class."""

from __future__ import annotations

from typing import Any

from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.models.llama import decoder_rules, decoder_shapes


def qwen2_config(hf: HFConfig) -> dict[str, Any]:
    return {"qwen_type": hf.model_type, "attn_bias": True, "mlp_bias": False,
            "tie_word_embeddings": hf.tie_word_embeddings, "use_logn_attn": False,
            "seq_length": hf.max_position_embeddings}


def qwen2_flags(config: dict[str, Any]) -> dict[str, Any]:
    """``qwen2_config`` read back: Qwen2's ``attn_bias`` means q/k/v biases only (o_proj has none)."""
    return {"tie_word_embeddings": bool(config.get("tie_word_embeddings"))}


QWEN2 = Family(
    name="qwen2",
    architectures=("Qwen2ForCausalLM",),
    model_types=("qwen2",),
    rules=lambda hf: decoder_rules(hf, qkv_bias=True),
    extra_config=qwen2_config,
    hf_shapes=decoder_shapes,
    checkpoint_flags=qwen2_flags,
)
