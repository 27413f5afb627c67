"""The tensors every rank file of a TensorRT-LLM checkpoint holds, stated once (no torch), quantization scales
included; the rank arithmetic they follow (ranks, pipeline stages, KV-head duplication, vocabulary padding) is
``mapping.py``.

The converter writes, the planner counts and the CPU runtime checks exactly what ``rank_tensors`` says. A
rank's tensors come from the family's ``Rule`` table (names, sources, split, stage) and the quantization's
entries (``docs/trtllm-checkpoint.md`` §5: FP8 scales, SmoothQuant scales and smoothers, the KV-cache scale).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trtllm_kit.mapping import Mapping, layers_for_rank, pad_vocab_size, qkv_rows
from trtllm_kit.models.base import Family, Place, Rule, Slice, Split
from trtllm_kit.models.hf_config import HFConfig

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "float8_e4m3fn": 1}
FP8 = "float8_e4m3fn"
F32 = "float32"
LAYER_PREFIX = "transformer.layers."
LAYER_RULE_PREFIX = LAYER_PREFIX + "{}."  # a family table's rule names keep a {} slot for the layer
LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")
LINEAR_WEIGHTS = tuple(f"{module}.weight" for module in LINEARS)
NORM_INPUTS = {"input_layernorm": ("attention.qkv",), "post_layernorm": ("mlp.fc", "mlp.gate")}
ROW_LINEARS = {"attention.dense": "attention.quantization_scaling_factor",
               "mlp.proj": "mlp.quantization_scaling_factor"}
KV_SCALE_NAME = "attention.kv_cache_scaling_factor"
SQ_PREFIX = "W8A8_SQ_"
AWQ_GROUP_SIZE = 128  # input features per INT4 AWQ weight scale, by default
AWQ_GROUP_SIZES = (64, 128)  # the group sizes TensorRT-LLM's W4A16 AWQ kernels take (``quantization.group_size``)
PACKED_ALGOS = ("NVFP4", "W4A16_AWQ")  # 4-bit weights, two per byte


@dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype name (``float16``, ``int8``, ``float8_e4m3fn`` …) of one tensor in a rank file."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class QuantLayout:
    """The ``quant_algo`` and ``kv_cache_quant_algo`` names that decide which scale tensors a rank file holds, and
    the INT4 AWQ ``group_size`` that decides their shape."""

    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    group_size: int = AWQ_GROUP_SIZE

    @classmethod
    def from_dict(cls, quantization: dict[str, Any] | None) -> QuantLayout:
        """Read a checkpoint's ``quantization`` object (None or empty: unquantized).

        Arguments:
            quantization: the ``quantization`` object of ``config.json``.
        """
        quantization = quantization or {}
        return cls(quantization.get("quant_algo"), quantization.get("kv_cache_quant_algo"),
                   quantization.get("group_size") or AWQ_GROUP_SIZE)

    @property
    def is_fp8(self) -> bool:
        return self.quant_algo == "FP8"

    @property
    def is_awq(self) -> bool:
        return self.quant_algo == "W4A16_AWQ"

    @property
    def is_smoothquant(self) -> bool:
        return (self.quant_algo or "").startswith(SQ_PREFIX)

    @property
    def per_channel(self) -> bool:
        return "PER_CHANNEL" in (self.quant_algo or "")

    @property
    def per_token(self) -> bool:
        return "PER_TOKEN" in (self.quant_algo or "")


def split_name(name: str) -> tuple[str, str, str]:
    """(layer prefix, module, parameter) of a TensorRT-LLM tensor name: ``transformer.layers.3.``,
    ``attention.qkv``, ``weight``; ``("", "", name)`` outside the layers.

    Arguments:
        name: a tensor name with a concrete layer number (or a rule's name with ``{}``).
    """
    if not name.startswith(LAYER_PREFIX):
        return "", "", name
    number, _, rest = name.removeprefix(LAYER_PREFIX).partition(".")
    module, _, param = rest.rpartition(".")
    return f"{LAYER_PREFIX}{number}.", module, param


def quant_entries(name: str, spec: TensorSpec, quant: QuantLayout) -> list[tuple[str, TensorSpec]]:
    """What a rank file holds for one tensor of plain per-rank ``spec`` under a quantization (§5).

    Arguments:
        name: the tensor's name in the rank file; spec: its unquantized shape and the checkpoint dtype;
        quant: the quantization.
    """
    base, module, param = split_name(name)
    prefix = name.rsplit(".", 1)[0]
    entries = [(name, spec)]
    scalar = TensorSpec((1,), F32)
    if param != "weight":
        return entries
    if quant.is_fp8 and module in LINEARS:
        entries = [(name, TensorSpec(spec.shape, FP8)), (f"{prefix}.weights_scaling_factor", scalar),
                   (f"{prefix}.activation_scaling_factor", scalar)]
    elif quant.is_awq and module in LINEARS:  # int4 two output rows per byte (ModelOpt's TensorRT-LLM export)
        out_local, in_local = spec.shape
        entries = [(name, TensorSpec((out_local // 2, in_local), "int8")),
                   (f"{prefix}.weights_scaling_factor", TensorSpec((out_local, in_local // quant.group_size), F32)),
                   (f"{prefix}.prequant_scaling_factor", TensorSpec((in_local,), spec.dtype))]
    elif quant.is_smoothquant and module in NORM_INPUTS:
        entries.append((f"{prefix}.scale_to_int", scalar))
    elif quant.is_smoothquant and module in LINEARS:
        out_local, in_local = spec.shape
        channels = out_local if quant.per_channel or module == "attention.qkv" else 1
        entries = [(name, TensorSpec(spec.shape, "int8")),
                   (f"{prefix}.per_channel_scale", TensorSpec((1, channels), F32))]
        if not quant.per_token:
            entries.append((f"{prefix}.act_scale", TensorSpec((1, 1), F32)))
        if module in ROW_LINEARS:
            entries.append((f"{prefix}.smoother", TensorSpec((1, in_local), F32)))
            if not quant.per_token:
                entries.append((base + ROW_LINEARS[module], scalar))
    if quant.kv_cache_quant_algo and module == "attention.qkv":
        entries.append((base + KV_SCALE_NAME, scalar))
    return entries


def source_shape(source: str | Slice, hf_shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The shape a rule reads from one source: the HF tensor's, or its row range.

    Arguments:
        source: a rule's source (with the ``{}`` slot); hf_shapes: the family's ``hf_shapes``.
    """
    if isinstance(source, Slice):
        return (source.rows, *hf_shapes[source.name][1:])
    return hf_shapes[source]


def shard_shape(shape: tuple[int, ...], split: Split, tp_size: int, *, qkv_rows: int | None = None) -> tuple[int, ...]:
    """The per-rank shape of one tensor split ``split`` ways (for QKV, the fused rows must be given).

    Arguments:
        shape: the full shape; split: the split style; tp_size: tensor-parallel size; qkv_rows: for QKV.
    """
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


def local_shape(rule: Rule, hf: HFConfig, hf_shapes: dict[str, tuple[int, ...]], tp_size: int) -> tuple[int, ...]:
    """The shape of a rule's tensor on one tensor-parallel rank (several column sources: their parts stacked).

    Arguments:
        rule: the weight-table entry; hf: the model config; hf_shapes: the family's ``hf_shapes(hf)``;
        tp_size: tensor-parallel size.
    """
    parts = [source_shape(s, hf_shapes) for s in rule.sources]
    if rule.split is Split.QKV:
        rows = qkv_rows(hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, tp_size)
        return shard_shape(parts[0], rule.split, tp_size, qkv_rows=rows)
    shapes = [shard_shape(p, rule.split, tp_size) for p in parts]
    return (sum(s[0] for s in shapes), *shapes[0][1:])


@dataclass(frozen=True)
class Placed:
    """A rule placed on a pipeline stage: its global HF layer and its layer number in the stage's files."""

    rule: Rule
    layer: int | None
    local_layer: int | None

    @property
    def target(self) -> str:
        return self.rule.target_name(self.local_layer)


def stage_rules(rules: list[Rule], num_layers: int, mapping: Mapping, pp_rank: int) -> Iterator[Placed]:
    """A stage's tensors in file order: the embedding (first stage), its layers, ``ln_f`` and ``lm_head`` (last).

    Arguments:
        rules: the family's table; num_layers: the model's layers; mapping: the layout; pp_rank: the stage.
    """
    if pp_rank == 0:
        yield from (Placed(r, None, None) for r in rules if r.place is Place.FIRST)
    for local, layer in enumerate(layers_for_rank(num_layers, mapping.pp_size, pp_rank)):
        yield from (Placed(r, layer, local) for r in rules if r.place is Place.LAYER)
    if pp_rank == mapping.pp_size - 1:
        yield from (Placed(r, None, None) for r in rules if r.place is Place.LAST)


def rank_tensors(hf: HFConfig, family: Family, mapping: Mapping, rank: int, quant: QuantLayout | None = None,
                 dtype: str = "float16", *, embedding_split: int | None = None) -> dict[str, TensorSpec]:
    """Every tensor of ``rank{rank}.safetensors`` in file order, with its shape and dtype.

    Arguments:
        hf: the model config (from HF, or ``Family.hf_config_of_checkpoint`` for a checkpoint); family: its
        weight table; mapping: the layout; rank: the global rank; quant: the quantization (None: unquantized);
        dtype: the checkpoint dtype; embedding_split: for checkpoints written with ``use_parallel_embedding``,
        the ``embedding_sharding_dim`` (0: padded vocabulary rows, 1: hidden columns); None: replicated.
    """
    quant = quant or QuantLayout()
    rules, shapes, tp = family.rules(hf), family.hf_shapes(hf), mapping.tp_size
    tensors: dict[str, TensorSpec] = {}
    for placed in stage_rules(rules, hf.num_hidden_layers, mapping, mapping.pp_rank(rank)):
        shape = local_shape(placed.rule, hf, shapes, tp)
        if placed.rule.place is Place.FIRST and embedding_split is not None:
            vocab, hidden = shape
            shape = (pad_vocab_size(vocab, tp) // tp, hidden) if embedding_split == 0 else (vocab, hidden // tp)
        tensors.update(quant_entries(placed.target, TensorSpec(shape, dtype), quant))
    return tensors
