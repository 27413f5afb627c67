"""Llama (Llama 2 and 3, TinyLlama): the HF → TensorRT-LLM weight table and config keys."""

from __future__ import annotations

from typing import Any

from trtllm_kit.models.base import Family, Place, Rule, Split
from trtllm_kit.models.hf_config import HFConfig

ATTN = "model.layers.{}.self_attn"
MLP = "model.layers.{}.mlp"
LAYER = "transformer.layers.{}"


def decoder_rules(hf: HFConfig, *, qkv_bias: bool) -> list[Rule]:
    """The table shared by Llama, Mistral and Qwen2.

    TensorRT-LLM's ``mlp.fc`` is HF ``gate_proj`` (the activated branch) and ``mlp.gate`` is ``up_proj``.

    Arguments:
        hf: the model config (decides the lm_head source and the biases).
        qkv_bias: whether q/k/v projections carry biases.
    """
    lm_head_source = "model.embed_tokens.weight" if hf.tie_word_embeddings else "lm_head.weight"
    rules = [
        Rule("transformer.vocab_embedding.weight", ("model.embed_tokens.weight",), Split.REPLICATE, Place.FIRST),
        Rule(f"{LAYER}.input_layernorm.weight", ("model.layers.{}.input_layernorm.weight",), Split.REPLICATE),
        Rule(f"{LAYER}.attention.qkv.weight",
             (f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"), Split.QKV),
    ]
    if qkv_bias:
        rules.append(Rule(f"{LAYER}.attention.qkv.bias",
                          (f"{ATTN}.q_proj.bias", f"{ATTN}.k_proj.bias", f"{ATTN}.v_proj.bias"), Split.QKV))
    rules.append(Rule(f"{LAYER}.attention.dense.weight", (f"{ATTN}.o_proj.weight",), Split.ROW))
    if hf.attention_bias:
        rules.append(Rule(f"{LAYER}.attention.dense.bias", (f"{ATTN}.o_proj.bias",), Split.REPLICATE))
    rules += [
        Rule(f"{LAYER}.post_layernorm.weight", ("model.layers.{}.post_attention_layernorm.weight",),
             Split.REPLICATE),
        Rule(f"{LAYER}.mlp.fc.weight", (f"{MLP}.gate_proj.weight",), Split.COLUMN),
        Rule(f"{LAYER}.mlp.gate.weight", (f"{MLP}.up_proj.weight",), Split.COLUMN),
        Rule(f"{LAYER}.mlp.proj.weight", (f"{MLP}.down_proj.weight",), Split.ROW),
    ]
    if hf.mlp_bias:
        rules += [
            Rule(f"{LAYER}.mlp.fc.bias", (f"{MLP}.gate_proj.bias",), Split.COLUMN),
            Rule(f"{LAYER}.mlp.gate.bias", (f"{MLP}.up_proj.bias",), Split.COLUMN),
            Rule(f"{LAYER}.mlp.proj.bias", (f"{MLP}.down_proj.bias",), Split.REPLICATE),
        ]
    rules += [
        Rule("transformer.ln_f.weight", ("model.norm.weight",), Split.REPLICATE, Place.LAST),
        Rule("lm_head.weight", (lm_head_source,), Split.VOCAB, Place.LAST),
    ]
    return rules


def decoder_shapes(hf: HFConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every HF tensor the Llama-style table can read."""
    h, i, v = hf.hidden_size, hf.intermediate_size, hf.vocab_size
    q, kv = hf.num_attention_heads * hf.head_dim, hf.num_key_value_heads * hf.head_dim
    return {
        "model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "model.norm.weight": (h,),
        "model.layers.{}.input_layernorm.weight": (h,),
        "model.layers.{}.post_attention_layernorm.weight": (h,),
        f"{ATTN}.q_proj.weight": (q, h), f"{ATTN}.k_proj.weight": (kv, h), f"{ATTN}.v_proj.weight": (kv, h),
        f"{ATTN}.q_proj.bias": (q,), f"{ATTN}.k_proj.bias": (kv,), f"{ATTN}.v_proj.bias": (kv,),
        f"{ATTN}.o_proj.weight": (h, q), f"{ATTN}.o_proj.bias": (h,),
        f"{MLP}.gate_proj.weight": (i, h), f"{MLP}.up_proj.weight": (i, h), f"{MLP}.down_proj.weight": (h, i),
        f"{MLP}.gate_proj.bias": (i,), f"{MLP}.up_proj.bias": (i,), f"{MLP}.down_proj.bias": (h,),
    }


def llama_config(hf: HFConfig) -> dict[str, Any]:
    return {"attn_bias": hf.attention_bias, "mlp_bias": hf.mlp_bias,
            "tie_word_embeddings": hf.tie_word_embeddings}


def llama_flags(config: dict[str, Any]) -> dict[str, Any]:
    """``llama_config`` read back: Llama's ``attn_bias`` covers q/k/v and o_proj."""
    return {"attention_bias": bool(config.get("attn_bias")), "mlp_bias": bool(config.get("mlp_bias")),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings"))}


LLAMA = Family(
    name="llama",
    architectures=("LlamaForCausalLM",),
    model_types=("llama",),
    rules=lambda hf: decoder_rules(hf, qkv_bias=hf.attention_bias),
    extra_config=llama_config,
    hf_shapes=decoder_shapes,
    checkpoint_flags=llama_flags,
)
