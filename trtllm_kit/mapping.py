"""The parallel layout's arithmetic, stated once (no torch): the TP/PP ``Mapping`` of ranks, the layers of a
pipeline stage, the padded vocabulary, KV-head duplication, a rank's fused q/k/v rows, and the tensor-parallel
sizes a model's shapes can be split by."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trtllm_kit.errors import CheckpointError, KitUsageError


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

    def ranks(self) -> range:
        """Every global rank, in file order (``rank{N}.safetensors``)."""
        return range(self.world_size)

    def to_dict(self) -> dict[str, int]:
        """The ``mapping`` object of a checkpoint ``config.json`` (portable keys only)."""
        return {"world_size": self.world_size, "tp_size": self.tp_size, "pp_size": self.pp_size}

    @classmethod
    def from_dict(cls, mapping: dict[str, Any], source: str = "config.json") -> Mapping:
        """Read a checkpoint's ``mapping`` object; missing sizes are 1, a world size other than tp × pp is refused.

        Arguments:
            mapping: the ``mapping`` object (may be empty); source: its file, for error messages.
        """
        tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
        if int(mapping.get("world_size", tp * pp)) != tp * pp:
            raise CheckpointError(f"{source} has mapping.world_size {mapping['world_size']} but tp_size {tp} "
                                  f"× pp_size {pp} = {tp * pp}; the config is inconsistent: convert again.")
        return cls(tp, pp)


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
    """The vocabulary rounded up to a multiple of ``tp_size`` (lm_head rows, zero-padded).

    Arguments:
        vocab_size: the unpadded vocabulary; tp_size: tensor-parallel size.
    """
    return math.ceil(vocab_size / tp_size) * tp_size


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """``ceil(Nkv / tp)``: KV heads are duplicated when there are fewer than ranks.

    Arguments:
        num_kv_heads: the model's KV heads; tp_size: tensor-parallel size.
    """
    return (num_kv_heads + tp_size - 1) // tp_size


def qkv_rows(num_heads: int, num_kv_heads: int, head_dim: int, tp_size: int) -> int:
    """Rows of one rank's fused ``attention.qkv``: its query heads, then its (possibly duplicated) K and V heads.

    Arguments:
        num_heads, num_kv_heads, head_dim: the model's attention shape; tp_size: tensor-parallel size.
    """
    return (num_heads // tp_size + 2 * kv_heads_per_rank(num_kv_heads, tp_size)) * head_dim


def check_tp(num_heads: int, num_kv_heads: int, intermediate_size: int, tp_size: int) -> None:
    """Refuse a tensor-parallel size the model's shapes cannot be split by, naming the sizes.

    Arguments:
        num_heads, num_kv_heads, intermediate_size: the model's sizes; tp_size: tensor-parallel size.
    """
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
