"""Tensor and pipeline parallelism on tensors: pure functions of (tensor, style, rank, size).

The layout facts (ranks, stages, padding, KV-head counts, per-rank shapes) live in ``trtllm_kit.layout``.
"""

from __future__ import annotations

import torch

from trtllm_kit.mapping import pad_vocab_size
from trtllm_kit.models.base import Split


def duplicate_kv_heads(tensor: torch.Tensor, num_kv_heads: int, tp_size: int) -> torch.Tensor:
    """Repeat each KV head ``tp_size // num_kv_heads`` times in head order (h0,h0,h1,h1,...)."""
    if num_kv_heads >= tp_size:
        return tensor
    reps = tp_size // num_kv_heads
    heads = tensor.reshape(num_kv_heads, -1, *tensor.shape[1:])
    return heads.repeat_interleave(reps, dim=0).reshape(-1, *tensor.shape[1:])


def qkv_parts(parts: list[torch.Tensor], num_kv_heads: int, tp_size: int, tp_rank: int) -> list[torch.Tensor]:
    """``[q_r, k_r, v_r]``: q, k and v each split along dim 0 after KV-head duplication."""
    q, k, v = parts
    k = duplicate_kv_heads(k, num_kv_heads, tp_size)
    v = duplicate_kv_heads(v, num_kv_heads, tp_size)
    return [torch.chunk(t, tp_size, dim=0)[tp_rank] for t in (q, k, v)]


def split_qkv(parts: list[torch.Tensor], num_kv_heads: int, tp_size: int, tp_rank: int) -> torch.Tensor:
    """``cat([q_r, k_r, v_r])``: one rank's fused QKV tensor (weight or bias).

    Arguments:
        parts: the full q, k and v tensors.
        num_kv_heads: the model's KV heads (duplicated when fewer than ``tp_size``).
        tp_size: tensor-parallel size.
        tp_rank: the rank.
    """
    return torch.cat(qkv_parts(parts, num_kv_heads, tp_size, tp_rank), dim=0)


def shard(tensor: torch.Tensor, split: Split, tp_size: int, tp_rank: int) -> torch.Tensor:
    """One rank's part of a (non-QKV) tensor.

    Arguments:
        tensor: the full tensor.
        split: the split style.
        tp_size: tensor-parallel size.
        tp_rank: the rank.
    """
    if split is Split.REPLICATE or tp_size == 1:
        return tensor
    if split is Split.COLUMN:
        return torch.chunk(tensor, tp_size, dim=0)[tp_rank]
    if split is Split.ROW:
        return torch.chunk(tensor, tp_size, dim=1)[tp_rank]
    if split is Split.VOCAB:
        rows = tensor.shape[0]
        padded = pad_vocab_size(rows, tp_size)
        per_rank = padded // tp_size
        start = tp_rank * per_rank
        part = tensor[start:min(start + per_rank, rows)]
        if part.shape[0] < per_rank:
            pad = tensor.new_zeros((per_rank - part.shape[0], *tensor.shape[1:]))
            part = torch.cat([part, pad], dim=0)
        return part
    raise ValueError(f"shard() does not take {split}; use split_qkv for q/k/v.")
