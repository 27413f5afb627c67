"""LoRA's module table: which PEFT modules a checkpoint's family has and their (in, out) sizes (``module_shapes``,
the one statement of it), and TensorRT-LLM's name and id of each. Without torch: commands that only read an
artifact's LoRA settings (verify, validate, serve, deploy) import it and start without loading torch.
"""

from __future__ import annotations

from typing import Any

FUSED_FAMILIES = ("Phi3ForCausalLM",)  # HF fuses qkv_proj and gate_up_proj
FUSED_GATE_UP = "gate_up_proj"


def module_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The PEFT module names of the checkpoint's family and their (in, out) sizes, unsharded.

    Arguments:
        config: a TensorRT-LLM checkpoint ``config.json``.
    """
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_size = int(config.get("head_size") or hidden // heads)
    inter = int(config["intermediate_size"])
    q, kv = heads * head_size, kv_heads * head_size
    if config.get("architecture") in FUSED_FAMILIES:
        return {"qkv_proj": (hidden, q + 2 * kv), "o_proj": (q, hidden), FUSED_GATE_UP: (hidden, 2 * inter),
                "down_proj": (inter, hidden)}
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


# TensorRT-LLM's name and module id (lora_manager.LORA_MODULE_IDS) of each PEFT module, as its code maps them
# (lora_helper.get_default_trtllm_modules_to_hf_modules): gate_proj is mlp_h_to_4h (5), up_proj is mlp_gate (7);
# the fused names are attn_qkv (0) and mlp_gate_up (18).
TRTLLM_MODULES = {"qkv_proj": ("attn_qkv", 0), "q_proj": ("attn_q", 1), "k_proj": ("attn_k", 2),
                  "v_proj": ("attn_v", 3), "o_proj": ("attn_dense", 4), "gate_proj": ("mlp_h_to_4h", 5),
                  "down_proj": ("mlp_4h_to_h", 6), "up_proj": ("mlp_gate", 7), FUSED_GATE_UP: ("mlp_gate_up", 18)}
MODULE_IDS = {module: module_id for module, (_, module_id) in TRTLLM_MODULES.items()}
