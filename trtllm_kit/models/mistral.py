"""Mistral: Llama's names and TensorRT-LLM class; the sliding window is a runtime setting."""

from __future__ import annotations

from trtllm_kit.models.base import Family
from trtllm_kit.models.llama import decoder_rules, decoder_shapes, llama_config, llama_flags

MISTRAL = Family(
    name="mistral",
    architectures=("MistralForCausalLM",),
    model_types=("mistral",),
    rules=lambda hf: decoder_rules(hf, qkv_bias=hf.attention_bias),
    extra_config=llama_config,
    hf_shapes=decoder_shapes,
    checkpoint_flags=llama_flags,
)
