"""The Hugging Face ``config.json`` of a GGUF file, from its metadata and tensor shapes.

GGUF names a model's shape under ``{architecture}.*`` keys (llama.cpp's names); each llama-family architecture the
kit imports is one ``GGUFArchitecture`` entry. Mistral files are ``llama`` in GGUF (llama.cpp converts them so) and
import as ``LlamaForCausalLM``, which computes the same function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trtllm_kit.errors import ModelError
from trtllm_kit.models.gguf.header import GGUFHeader
from trtllm_kit.models.gguf.rope_freqs import llama3_rope_scaling

MAX_COUNT = 1 << 24  # no layer, head, width or context count of a real model comes near


@dataclass(frozen=True)
class GGUFArchitecture:
    """One ``general.architecture`` the kit imports and the Hugging Face model it becomes."""

    name: str
    hf_architecture: str
    model_type: str
    permutes_qk: bool  # llama.cpp reorders q and k rows for its interleaved rotary embedding
    fixed: dict[str, Any] = field(default_factory=dict)  # config keys GGUF does not carry


ARCHITECTURES: dict[str, GGUFArchitecture] = {a.name: a for a in (
    GGUFArchitecture("llama", "LlamaForCausalLM", "llama", permutes_qk=True,
                     fixed={"mlp_bias": False, "pretraining_tp": 1}),
    GGUFArchitecture("qwen2", "Qwen2ForCausalLM", "qwen2", permutes_qk=False,
                     fixed={"use_sliding_window": False, "sliding_window": None}),
)}


def gguf_architecture(header: GGUFHeader) -> GGUFArchitecture:
    """The entry for the file's ``general.architecture``; a ``ModelError`` naming the ones the kit imports if none.

    Arguments:
        header: the file's header.
    """
    found = header.architecture
    if found not in ARCHITECTURES:
        raise ModelError(f"{header.path} is a {found!r} GGUF, which the kit does not import; it imports "
                         f"{', '.join(repr(a) for a in ARCHITECTURES)} (llama-family) files.")
    return ARCHITECTURES[found]


def _number(header: GGUFHeader, key: str, default: float | None = None) -> Any:
    value = header.metadata.get(key, default)
    if value is None:
        raise ModelError(f"{header.path} has no {key}; the file is incomplete: convert the model again.")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelError(f"{header.path}: {key} is {value!r}, not a number; the file is damaged: "
                         "download or convert it again.")
    return float(str(np.float32(value))) if isinstance(value, float) else value  # 1e-05, not 9.99999974e-06


def _count(header: GGUFHeader, key: str, default: int | None = None) -> int:
    """A positive whole number of the metadata (a layer, head or width count), at most ``MAX_COUNT``."""
    value = _number(header, key, default)
    if not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise ModelError(f"{header.path}: {key} is {value!r}, not a whole number from 1 to {MAX_COUNT}; the file is "
                         "damaged: download or convert it again.")
    return value


def hf_config(header: GGUFHeader, torch_dtype: torch.dtype, special_ids: dict[str, int | None]) -> dict[str, Any]:
    """The ``config.json`` content.

    Arguments:
        header: the file's header.
        torch_dtype: the dtype the weights are written in.
        special_ids: ``bos_token_id``, ``eos_token_id`` and ``pad_token_id`` from the tokenizer metadata.
    """
    arch = gguf_architecture(header)
    prefix = arch.name
    embed = header.tensors.get("token_embd.weight")
    if embed is None or len(embed.dims) != 2:
        raise ModelError(f"{header.path} has no two-dimensional token_embd.weight; it is not a llama-family model.")
    hidden, vocab = embed.dims
    heads = _count(header, f"{prefix}.attention.head_count")
    kv_heads = _count(header, f"{prefix}.attention.head_count_kv", heads)
    if heads % kv_heads:
        raise ModelError(f"{header.path}: {heads} attention heads do not share {kv_heads} KV heads evenly; the file "
                         "is damaged: download or convert it again.")
    head_dim = _count(header, f"{prefix}.attention.key_length", hidden // heads or 1)
    rotary = _count(header, f"{prefix}.rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ModelError(f"{header.path} rotates {rotary} of its {head_dim} head dimensions; the kit's llama-family "
                         "models rotate all of them, so it cannot import this file.")
    config: dict[str, Any] = {
        "architectures": [arch.hf_architecture], "model_type": arch.model_type,
        "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": _count(header, f"{prefix}.feed_forward_length"),
        "num_hidden_layers": _count(header, f"{prefix}.block_count"),
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "max_position_embeddings": _count(header, f"{prefix}.context_length", 2048),
        "rms_norm_eps": float(_number(header, f"{prefix}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_number(header, f"{prefix}.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(header, prefix, head_dim),
        "hidden_act": "silu", "tie_word_embeddings": "output.weight" not in header.tensors,
        "attention_bias": "blk.0.attn_q.bias" in header.tensors, "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True, "torch_dtype": str(torch_dtype).removeprefix("torch."),
        **{k: v for k, v in special_ids.items() if v is not None}, **arch.fixed,
    }
    if arch.model_type == "qwen2":
        config["max_window_layers"] = config["num_hidden_layers"]
        del config["attention_bias"]  # Qwen2 always has q/k/v biases
    return config


def _rope_scaling(header: GGUFHeader, prefix: str, head_dim: int) -> dict[str, Any] | None:
    """``rope_scaling`` from ``{arch}.rope.scaling.*`` or from a ``rope_freqs.weight`` tensor (Llama 3's)."""
    kind = header.metadata.get(f"{prefix}.rope.scaling.type", "none")
    if "rope_freqs.weight" in header.tensors:
        return llama3_rope_scaling(header, head_dim)
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(_number(header, f"{prefix}.rope.scaling.factor"))}
    raise ModelError(f"{header.path} uses {kind!r} RoPE scaling; the kit imports GGUF files without RoPE scaling, "
                     "with linear scaling or with Llama 3's frequency factors.")
