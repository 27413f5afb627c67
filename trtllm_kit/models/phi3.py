"""Phi-3 (``Phi3ForCausalLM``, Phi-3-mini-4k): fused HF ``qkv_proj`` and ``gate_up_proj`` sliced into
TensorRT-LLM's ``attention.qkv`` and the fused ``mlp.fc`` of its ``swiglu`` MLP (docs/phi3.md).

HF ``qkv_proj`` stacks q, k and v along dim 0; each is split like Llama's (KV heads duplicated when fewer than
tp). HF ``gate_up_proj`` stacks gate then up; TensorRT-LLM's ``swiglu`` computes ``x * silu(g)`` from the
halves ``[x; g]`` of each rank's ``mlp.fc`` output, so every rank holds its rows of up, then its rows of gate.
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.errors import ModelError
from trtllm_kit.models.base import Activation, Family, Norm, Place, Rule, Slice, Split
from trtllm_kit.models.hf_config import HFConfig

ATTN = "model.layers.{}.self_attn"
MLP = "model.layers.{}.mlp"
LAYER = "transformer.layers.{}"
LONG_CONTEXT = 128000  # upstream writes a long_rope checkpoint from this max_position_embeddings on


def phi3_rules(hf: HFConfig) -> list[Rule]:
    """The Phi-3 weight table: q, k, v and up, gate are row slices of the fused HF tensors.

    Arguments:
        hf: the model config (decides the slice rows and the lm_head source).
    """
    q, kv, inter = hf.num_attention_heads * hf.head_dim, hf.num_key_value_heads * hf.head_dim, hf.intermediate_size
    qkv, gate_up = f"{ATTN}.qkv_proj.weight", f"{MLP}.gate_up_proj.weight"
    lm_head_source = "model.embed_tokens.weight" if hf.tie_word_embeddings else "lm_head.weight"
    return [
        Rule("transformer.vocab_embedding.weight", ("model.embed_tokens.weight",), Split.REPLICATE, Place.FIRST),
        Rule(f"{LAYER}.input_layernorm.weight", ("model.layers.{}.input_layernorm.weight",), Split.REPLICATE),
        Rule(f"{LAYER}.attention.qkv.weight",
             (Slice(qkv, 0, q), Slice(qkv, q, q + kv), Slice(qkv, q + kv, q + 2 * kv)), Split.QKV),
        Rule(f"{LAYER}.attention.dense.weight", (f"{ATTN}.o_proj.weight",), Split.ROW),
        Rule(f"{LAYER}.post_layernorm.weight", ("model.layers.{}.post_attention_layernorm.weight",),
             Split.REPLICATE),
        Rule(f"{LAYER}.mlp.fc.weight", (Slice(gate_up, inter, 2 * inter), Slice(gate_up, 0, inter)), Split.COLUMN),
        Rule(f"{LAYER}.mlp.proj.weight", (f"{MLP}.down_proj.weight",), Split.ROW),
        Rule("transformer.ln_f.weight", ("model.norm.weight",), Split.REPLICATE, Place.LAST),
        Rule("lm_head.weight", (lm_head_source,), Split.VOCAB, Place.LAST),
    ]


def phi3_shapes(hf: HFConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every HF tensor the Phi-3 table reads."""
    h, i, v = hf.hidden_size, hf.intermediate_size, hf.vocab_size
    q, kv = hf.num_attention_heads * hf.head_dim, hf.num_key_value_heads * hf.head_dim
    return {
        "model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "model.norm.weight": (h,),
        "model.layers.{}.input_layernorm.weight": (h,), "model.layers.{}.post_attention_layernorm.weight": (h,),
        f"{ATTN}.qkv_proj.weight": (q + 2 * kv, h), f"{ATTN}.o_proj.weight": (h, q),
        f"{MLP}.gate_up_proj.weight": (2 * i, h), f"{MLP}.down_proj.weight": (h, i),
    }


def phi3_config(hf: HFConfig) -> dict[str, Any]:
    """``Phi3Config`` keys: the ``swiglu`` activation upstream writes for HF ``silu``, the rotary fraction its
    decoder layer reads, and the tied embedding flag."""
    return {"hidden_act": Activation.SWIGLU.value, "rotary_pct": 1.0, "tie_word_embeddings": hf.tie_word_embeddings}


def phi3_flags(config: dict[str, Any]) -> dict[str, Any]:
    return {"tie_word_embeddings": bool(config.get("tie_word_embeddings"))}


def check_phi3(hf: HFConfig, source: str) -> None:
    """Refuse the Phi-3 variants the kit cannot convert faithfully: LongRoPE (128k context, Phi-3.5, Phi-4-mini),
    partial rotary embeddings and activations other than SiLU.

    Arguments:
        hf: the model config; source: the model's name for the message.
    """
    raw = hf.raw
    partial = raw.get("partial_rotary_factor", (raw.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0))
    if hf.rope_scaling is not None or hf.max_position_embeddings >= LONG_CONTEXT:
        kind = (hf.rope_scaling or {}).get("rope_type", "longrope")
        raise ModelError(f"{source} uses {kind!r} RoPE scaling (a long-context Phi-3), which TensorRT-LLM builds as "
                         "long_rope and the kit does not convert; use a 4k-context Phi-3 such as "
                         "Phi-3-mini-4k-instruct.")
    if float(partial or 1.0) != 1.0:
        raise ModelError(f"{source} rotates only a fraction {partial} of each head (partial_rotary_factor); the kit "
                         "converts Phi-3 models with full rotary embeddings only.")
    if hf.hidden_act != "silu":
        raise ModelError(f"{source} has hidden_act {hf.hidden_act!r}; Phi-3 conversion needs 'silu' (TensorRT-LLM "
                         "'swiglu').")


PHI3 = Family(
    name="phi3",
    architectures=("Phi3ForCausalLM",),
    model_types=("phi3",),
    rules=phi3_rules,
    extra_config=phi3_config,
    hf_shapes=phi3_shapes,
    checkpoint_flags=phi3_flags,
    norm=Norm.RMS,
    activation=Activation.SWIGLU,
    check=check_phi3,
)
