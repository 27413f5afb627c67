"""The sizes a checkpoint's forward pass needs, read and checked from its ``config.json``, and the norm forms the
CPU runtime computes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.errors import CheckpointError, KitUsageError
from trtllm_kit.mapping import Mapping, check_tp, kv_heads_per_rank, layers_for_rank
from trtllm_kit.models.base import Norm
from trtllm_kit.models.registry import family_of_checkpoint
from trtllm_kit.runtime.layers import check_quantization, rms_norm

NORMS = {Norm.RMS: rms_norm}  # the norm forms the runtime computes


@dataclass(frozen=True)
class Dims:
    """The sizes the forward pass needs, read from a checkpoint ``config.json``."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    norm_epsilon: float
    tp_size: int
    pp_size: int

    @property
    def num_heads_per_rank(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def num_kv_heads_per_rank(self) -> int:
        return kv_heads_per_rank(self.num_kv_heads, self.tp_size)

    @property
    def mapping(self) -> Mapping:
        return Mapping(self.tp_size, self.pp_size)

    def layers_for_stage(self, pp_rank: int) -> list[int]:
        """The global layers of a pipeline stage (TensorRT-LLM 1.x: ``tensor_split``)."""
        return list(layers_for_rank(self.num_layers, self.pp_size, pp_rank))

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> Dims:
        """Validate a checkpoint config and read its sizes.

        Arguments:
            config: the parsed ``config.json``; source: its path, for error messages.
        """
        family = family_of_checkpoint(config.get("architecture"), source)
        check_quantization(config.get("quantization") or {}, source)
        for key, want in (("position_embedding_type", "rope_gpt_neox"), ("hidden_act", family.activation.value),
                          ("rotary_pct", 1.0)):
            if config.get(key, want) != want:
                raise CheckpointError(f"{source} has {key} {config[key]!r}; the CPU runtime needs {want!r}.")
        if family.norm not in NORMS:
            raise CheckpointError(f"{source}: the CPU runtime has no {family.norm.value} norm.")
        mapping = Mapping.from_dict(config.get("mapping") or {}, source)
        tp, pp = mapping.tp_size, mapping.pp_size
        try:
            heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
            dims = cls(vocab_size=int(config["vocab_size"]), hidden_size=hidden,
                       num_layers=int(config["num_hidden_layers"]), num_heads=heads,
                       num_kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_size=int(config.get("head_size") or hidden // heads),
                       intermediate_size=int(config["intermediate_size"]),
                       norm_epsilon=float(config.get("norm_epsilon", 1e-5)), tp_size=tp, pp_size=pp)
        except KeyError as missing:
            raise CheckpointError(f"{source} lacks the key {missing.args[0]!r}.") from None
        try:
            check_tp(heads, dims.num_kv_heads, dims.intermediate_size, tp)
            layers_for_rank(dims.num_layers, pp, 0)
        except KitUsageError:
            raise CheckpointError(f"{source}: {heads} heads, {dims.num_kv_heads} KV heads, intermediate size "
                                  f"{dims.intermediate_size} and {dims.num_layers} layers cannot be split "
                                  f"over tp_size {tp} and pp_size {pp}.") from None
        return dims
