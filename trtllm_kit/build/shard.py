"""Tensor and pipeline parallelism as pure functions of (tensor, style, rank, size)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.base import Split


@dataclass(frozen=True)
class Mapping:
    """The parallel layout: rank = tp_rank + tp_size * pp_rank (context parallelism is always 1)."""

    tp_size: int = 1
    pp_size: int = 1

    def __post_init__(self) -> None:
        for name in ("tp_size", "pp_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KitUsageError(f"{name} must be a positive integer, got {value!r}.")

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def rank(self, tp_rank: int, pp_rank: int) -> int:
        return tp_rank + self.tp_size * pp_rank

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp_size

    def pp_rank(self, rank: int) -> int:
        return rank // self.tp_size

    def to_dict(self) -> dict[str, int]:
        """The ``mapping`` object of a checkpoint ``config.json`` (portable keys only)."""
        return {"world_size": self.world_size, "tp_size": self.tp_size, "pp_size": self.pp_size}


def layers_for_rank(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """The global layers of a pipeline stage: ``torch.tensor_split`` (the first ``L % pp`` stages get one more).

    Arguments:
        num_layers: the model's layer count.
        pp_size: the number of pipeline stages.
        pp_rank: the stage.
    """
    if pp_size > num_layers:
        raise KitUsageError(f"pp_size {pp_size} is larger than the model's {num_layers} layers; "
                            f"choose pp_size <= {num_layers}.")
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank {pp_rank} is outside 0..{pp_size - 1}")
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (1 if pp_rank < extra else 0))


def pad_vocab_size(vocab_size: int, tp_size: int) -> int:
    return math.ceil(vocab_size / tp_size) * tp_size


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    return (num_kv_heads + tp_size - 1) // tp_size


def check_tp(num_heads: int, num_kv_heads: int, intermediate_size: int, tp_size: int) -> None:
    """Refuse a tensor-parallel size the model's shapes cannot be split by, naming the sizes."""
    if num_heads % tp_size:
        raise KitUsageError(f"num_attention_heads {num_heads} is not divisible by tp_size {tp_size}; "
                            f"choose a tp_size that divides {num_heads}.")
    if intermediate_size % tp_size:
        raise KitUsageError(f"intermediate_size {intermediate_size} is not divisible by tp_size {tp_size}.")
    if num_kv_heads >= tp_size and num_kv_heads % tp_size:
        raise KitUsageError(f"num_key_value_heads {num_kv_heads} is not divisible by tp_size {tp_size}.")
    if num_kv_heads < tp_size and tp_size % num_kv_heads:
        raise KitUsageError(f"tp_size {tp_size} is not a multiple of num_key_value_heads {num_kv_heads}, "
                            "so KV heads cannot be duplicated evenly.")


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


def shard_shape(shape: tuple[int, ...], split: Split, tp_size: int, *, qkv_rows: int | None = None) -> tuple[int, ...]:
    """The per-rank shape of a tensor (for headers written before any data)."""
    if split is Split.QKV:
        assert qkv_rows is not None
        return (qkv_rows, *shape[1:])
    if split is Split.COLUMN:
        return (shape[0] // tp_size, *shape[1:])
    if split is Split.ROW:
        return (shape[0], shape[1] // tp_size)
    if split is Split.VOCAB:
        return (pad_vocab_size(shape[0], tp_size) // tp_size, *shape[1:])
    return shape
