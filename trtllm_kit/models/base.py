"""What a model family is: a weight-name table, its norm and activation, and a TensorRT-LLM config mapping."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from trtllm_kit.models.hf_config import HFConfig


class Split(str, Enum):
    """How a tensor is divided over tensor-parallel ranks."""

    COLUMN = "column"        # dim 0 (output features); 1-D biases along dim 0; several sources: each split
    ROW = "row"              # dim 1 (input features)
    QKV = "qkv"              # q, k, v each split along dim 0 (KV heads duplicated when fewer than tp)
    VOCAB = "vocab"          # rows zero-padded to a multiple of tp, then split along dim 0
    REPLICATE = "replicate"  # the full tensor on every rank


class Place(str, Enum):
    """Which pipeline stage holds a tensor."""

    FIRST = "first"  # the first stage (embedding)
    LAYER = "layer"  # the stage that owns the layer; names use the local layer number
    LAST = "last"    # the last stage (final norm, lm_head)


class Norm(str, Enum):
    """The normalisation a family's layers use."""

    RMS = "rms"  # RMSNorm: x / sqrt(mean(x²) + eps) · weight, no bias


class Activation(str, Enum):
    """The MLP's gated activation as TensorRT-LLM stores it; the value is the checkpoint's ``hidden_act``."""

    SILU = "silu"      # GatedMLP: proj(silu(fc(x)) * gate(x)), fc and gate separate tensors
    SWIGLU = "swiglu"  # MLP with a fused fc: per rank fc(x) = [x1; g] (halves), proj(x1 * silu(g))


@dataclass(frozen=True)
class Slice:
    """Rows ``[start, stop)`` (dim 0) of a fused HF tensor, e.g. q of Phi-3's ``qkv_proj``.

    ``name`` may hold the ``{}`` layer slot like any source name.
    """

    name: str
    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ValueError(f"{self.name}: rows [{self.start}, {self.stop}) are empty or negative")

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def format(self, layer: int | None) -> Slice:
        return replace(self, name=self.name.format(layer))


Source = str | Slice  # a whole HF tensor, or a row range of one


def source_name(source: Source) -> str:
    """The HF tensor name a source reads from."""
    return source.name if isinstance(source, Slice) else source


@dataclass(frozen=True)
class Rule:
    """One TensorRT-LLM tensor and where it comes from.

    ``{}`` in the names is the layer slot: the global HF layer on the source side, the local layer of the
    pipeline stage on the TensorRT-LLM side. Several sources are each split the rule's way and the rank's
    parts concatenated along dim 0 (q, k, v; Phi-3's up and gate). A source may be a ``Slice`` of a fused
    HF tensor; the converter then reads only those rows.
    """

    name: str
    sources: tuple[Source, ...]
    split: Split
    place: Place = Place.LAYER

    def layer_sources(self, layer: int | None) -> tuple[Source, ...]:
        """The sources with the layer slot filled in."""
        if self.place is not Place.LAYER:
            return self.sources
        return tuple(s.format(layer) for s in self.sources)

    def source_names(self, layer: int | None) -> tuple[str, ...]:
        """The HF tensor names read, one per source (a fused tensor repeats once per slice)."""
        return tuple(source_name(s) for s in self.layer_sources(layer))

    def target_name(self, local_layer: int | None) -> str:
        return self.name.format(local_layer) if self.place is Place.LAYER else self.name


@dataclass(frozen=True)
class Family:
    """A supported model family.

    ``rules(hf)`` gives the weight table for one config (biases depend on it); ``extra_config(hf)`` the
    family keys of the TensorRT-LLM ``config.json``; ``checkpoint_flags(config)`` reads them back as the HF
    fields the weight table depends on (``tie_word_embeddings``, ``attention_bias``, ``mlp_bias``);
    ``hf_shapes(hf)`` the shape every HF source must have (names with the ``{}`` layer slot); ``ignored``
    names HF tensors that have no counterpart; ``check(hf)`` refuses configs the family cannot convert;
    ``norm`` and ``activation`` say what the layers compute.
    """

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    rules: Callable[[HFConfig], list[Rule]]
    extra_config: Callable[[HFConfig], dict[str, Any]]
    hf_shapes: Callable[[HFConfig], dict[str, tuple[int, ...]]]
    checkpoint_flags: Callable[[dict[str, Any]], dict[str, Any]]
    ignored: tuple[str, ...] = ("model.layers.{}.self_attn.rotary_emb.inv_freq",)
    norm: Norm = Norm.RMS
    activation: Activation = Activation.SILU
    check: Callable[[HFConfig, str], None] | None = None

    def hf_config_of_checkpoint(self, config: dict[str, Any]) -> HFConfig:
        """The HF fields a TensorRT-LLM checkpoint ``config.json`` implies, enough for ``rules`` and ``hf_shapes``.

        Arguments:
            config: the parsed checkpoint ``config.json`` (``KeyError`` when a size is missing).
        """
        heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
        return HFConfig(
            model_type=self.model_types[0], architecture=str(config["architecture"]),
            vocab_size=int(config["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]), num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads, num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_size") or hidden // heads), hidden_act=str(config.get("hidden_act")),
            rms_norm_eps=float(config.get("norm_epsilon", 1e-5)),
            max_position_embeddings=int(config.get("max_position_embeddings") or 2048),
            dtype=str(config.get("dtype", "float32")), **self.checkpoint_flags(config))


@dataclass(frozen=True)
class WorkItem:
    """One TensorRT-LLM tensor name on one pipeline stage, with its HF sources."""

    rule: Rule
    layer: int | None        # global HF layer
    local_layer: int | None  # layer number inside the stage's rank files
    pp_rank: int

    @property
    def sources(self) -> tuple[str, ...]:
        """The HF tensor names read (a fused tensor once per slice)."""
        return self.rule.source_names(self.layer)

    @property
    def reads(self) -> tuple[Source, ...]:
        """The sources with the layer slot filled in: names, or row slices of fused tensors."""
        return self.rule.layer_sources(self.layer)

    @property
    def target(self) -> str:
        return self.rule.target_name(self.local_layer)
