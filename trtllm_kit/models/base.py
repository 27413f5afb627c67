"""What a model family is: a weight-name table and a TensorRT-LLM config mapping."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from trtllm_kit.models.hf_config import HFConfig


class Split(str, Enum):
    """How a tensor is divided over tensor-parallel ranks."""

    COLUMN = "column"        # dim 0 (output features); 1-D biases along dim 0
    ROW = "row"              # dim 1 (input features)
    QKV = "qkv"              # q, k, v each split along dim 0 (KV heads duplicated when fewer than tp)
    VOCAB = "vocab"          # rows zero-padded to a multiple of tp, then split along dim 0
    REPLICATE = "replicate"  # the full tensor on every rank


class Place(str, Enum):
    """Which pipeline stage holds a tensor."""

    FIRST = "first"  # the first stage (embedding)
    LAYER = "layer"  # the stage that owns the layer; names use the local layer number
    LAST = "last"    # the last stage (final norm, lm_head)


@dataclass(frozen=True)
class Rule:
    """One TensorRT-LLM tensor and where it comes from.

    ``{}`` in the names is the layer slot: the global HF layer on the source side, the local layer of the
    pipeline stage on the TensorRT-LLM side. Several sources are concatenated along dim 0 (q, k, v).
    """

    name: str
    sources: tuple[str, ...]
    split: Split
    place: Place = Place.LAYER

    def source_names(self, layer: int | None) -> tuple[str, ...]:
        return tuple(s.format(layer) for s in self.sources) if self.place is Place.LAYER else self.sources

    def target_name(self, local_layer: int | None) -> str:
        return self.name.format(local_layer) if self.place is Place.LAYER else self.name


@dataclass(frozen=True)
class Family:
    """A supported model family.

    ``rules(hf)`` gives the weight table for one config (biases depend on it); ``extra_config(hf)`` the
    family keys of the TensorRT-LLM ``config.json``; ``hf_shapes(hf)`` the shape every HF source must have
    (names with the ``{}`` layer slot); ``ignored`` names HF tensors that have no counterpart.
    """

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    rules: Callable[[HFConfig], list[Rule]]
    extra_config: Callable[[HFConfig], dict[str, Any]]
    hf_shapes: Callable[[HFConfig], dict[str, tuple[int, ...]]]
    ignored: tuple[str, ...] = ("model.layers.{}.self_attn.rotary_emb.inv_freq",)
