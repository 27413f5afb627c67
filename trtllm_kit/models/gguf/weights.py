"""GGUF tensor names to Hugging Face names, and the one reordering llama.cpp applies to them.

One table with a ``{}`` layer slot; ``None`` drops a tensor (its content lives in the config). llama.cpp stores a
llama model's q and k rows reordered for its interleaved rotary embedding; ``unpermute_rows`` undoes that, per
head, for the weight and for a bias alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from trtllm_kit.errors import ModelError
from trtllm_kit.models.gguf.config import GGUFArchitecture
from trtllm_kit.models.gguf.header import GGUFHeader, GGUFTensor
from trtllm_kit.models.gguf.tensor_data import output_dtype, read_tensor

NAMES: dict[str, str | None] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": None,  # Llama 3's RoPE scaling, read into config.json
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_q.bias": "model.layers.{}.self_attn.q_proj.bias",
    "blk.{}.attn_k.bias": "model.layers.{}.self_attn.k_proj.bias",
    "blk.{}.attn_v.bias": "model.layers.{}.self_attn.v_proj.bias",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
    "blk.{}.attn_rot_embd": None,  # rotary tables some old converters wrote; recomputed from the config
}
LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
PERMUTED = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}  # the head count of each


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, None for one that is dropped; a ``ModelError`` for an unknown one.

    Arguments:
        gguf_name: e.g. ``blk.3.ffn_gate.weight``.
    """
    match = LAYER.match(gguf_name)
    key, layer = (f"blk.{{}}.{match.group(2)}", match.group(1)) if match else (gguf_name, "")
    if key not in NAMES:
        raise ModelError(f"the GGUF file holds tensor {gguf_name}, which a llama-family model does not have; the kit "
                         "cannot import it.")
    target = NAMES[key]
    return None if target is None else target.format(layer)


def unpermute_rows(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The rows of a q or k projection (or bias) back in Hugging Face's order: within each head, llama.cpp
    interleaves the two rotary halves (rows 0, h, 1, h+1, ...); this puts the halves back one after the other.

    Arguments:
        tensor: ``[num_heads * head_dim, ...]`` as llama.cpp stores it; num_heads: its head count.
    """
    rows = tensor.shape[0]
    head_dim = rows // num_heads
    if rows % num_heads or head_dim % 2:
        raise ModelError(f"a q/k tensor of {rows} rows does not split into {num_heads} heads of an even size; the "
                         "GGUF's head counts do not match its tensors.")
    rest = tuple(tensor.shape[1:])
    return tensor.reshape(num_heads, head_dim // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)


def planned_tensors(header: GGUFHeader, config: dict[str, int]) -> list[tuple[GGUFTensor, str]]:
    """Every tensor to import with its Hugging Face name, in file order, dropped ones left out.

    Arguments:
        header: the file's header; config: the imported ``config.json`` (for the layer count).
    """
    planned = []
    for tensor in header.tensors.values():
        name = hf_name(tensor.name)
        match = LAYER.match(tensor.name)
        if match and int(match.group(1)) >= config["num_hidden_layers"]:
            raise ModelError(f"{header.path} holds {tensor.name}, but its block_count is "
                             f"{config['num_hidden_layers']}; the file is damaged: download or convert it again.")
        if name is not None:
            planned.append((tensor, name))
    return planned


def hf_tensors(header: GGUFHeader, arch: GGUFArchitecture, config: dict[str, int], fd: int,
               ) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors under their Hugging Face names, one at a time, in ``planned_tensors`` order.

    Arguments:
        header: the file's header; arch: its architecture entry; config: the imported ``config.json``;
        fd: the file, open for reading.
    """
    for tensor, name in planned_tensors(header, config):
        values = read_tensor(header, tensor, fd)
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        if arch.permutes_qk and kind in PERMUTED:
            values = unpermute_rows(values, config[PERMUTED[kind]])
        yield name, values.to(output_dtype(tensor.type_code))
