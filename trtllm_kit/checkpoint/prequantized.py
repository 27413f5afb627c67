"""A pre-quantized checkpoint (``quant/prequantized.py``) as the TensorRT-LLM checkpoint of the engine and cpu
targets: the converter's hook (what converts and what is refused: ``checkpoint/prequantized_checks.py``).

Per-tensor FP8 (ModelOpt unified, or compressed-tensors with static input scales) converts without de- and
re-quantizing: each linear's e4m3 weights are carried over with ``weight_scale`` as ``weights_scaling_factor`` and
``input_scale`` as ``activation_scaling_factor``; the KV cache's ``k_scale``/``v_scale`` give
``kv_cache_scaling_factor``. TensorRT-LLM runs fused q/k/v and gate/up as one GEMM with ONE weight and one input
scale; ModelOpt's unified export (0.47) and compressed-tensors both keep a weight scale per projection, so where a
fused group's scales differ, its parts are rescaled to the group's largest scale exactly as TensorRT-LLM's own
loader does for these checkpoints (``quant/fp8.py`` ``fp8_fused``), and the input scale is the group's largest.
The CPU runtime's loader for the llmapi target (``llmapi/load.py``) applies the same rule, so both targets run the
same weights.

ModelOpt's unified W4A16 AWQ converts losslessly for the engine target: both layouts pack two output rows per byte
and scale groups of the same size (64 or 128 input features, the input's ``group_size``), so the bytes and
``weight_scale`` are split as they are, and
``pre_quant_scale`` becomes ``prequant_scaling_factor`` (ones where the export folded it into the norm).
"""

from __future__ import annotations

from typing import Any

import torch
from safetensors import safe_open

from trtllm_kit.checkpoint.prequantized_checks import OWN_QUANT, kv_scale_names, layer_module
from trtllm_kit.checkpoint.shard import qkv_parts, shard
from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import AWQ_GROUP_SIZE, KV_SCALE_NAME, LINEARS
from trtllm_kit.models.base import Rule, Split, WorkItem
from trtllm_kit.models.inspect import ModelSpec
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.fp8 import fp8_fused
from trtllm_kit.quant.kv import fp8_kv_scale_of, kv_scale_tensor
from trtllm_kit.quant.prequantized import PreQuantized

F32 = torch.float32
Outputs = list[list[tuple[str, list[torch.Tensor]]]]
FUSED = {"mlp.fc": ("mlp.fc", "mlp.gate"), "mlp.gate": ("mlp.fc", "mlp.gate")}  # q/k/v are one work item
SCALE_SUFFIXES = ("weight_scale", "input_scale", "pre_quant_scale", "k_scale", "v_scale")


class PreQuantizedTransform:
    """The converter's hook (``checkpoint/convert.py`` ``TensorTransform``) for FP8 or W4A16 AWQ input: the parts it
    is given are the input's e4m3 values or packed int4 bytes in the checkpoint dtype (which holds both exactly),
    split as plain rows are (two int4 rows per byte), and written back in the input's encoding with its scales.

    Arguments:
        model: the inspected model; fmt: its format; rules: the family's weight table; dtype: the checkpoint dtype
        (the model dtype TensorRT-LLM rescales FP8 in).
    """

    def __init__(self, model: ModelSpec, fmt: PreQuantized, rules: list[Rule], dtype: torch.dtype) -> None:
        self.fmt = fmt
        self.dtype = dtype
        self.num_kv_heads = model.hf.num_key_value_heads
        self.modules = {layer_module(r): r for r in rules if layer_module(r)}
        self.scales = _read_scales(model)
        self.num_rescaled = 0  # fused FP8 modules whose parts were rescaled to one weight scale

    @property
    def quantization(self) -> dict[str, Any]:
        """The checkpoint's ``quantization`` object: what ``--quant fp8`` or ``int4-awq`` writes, with the input's
        KV cache."""
        quant = OWN_QUANT[self.fmt.quant_algo]
        kv = "fp8" if self.fmt.kv_cache_quant_algo == "FP8" else "auto"
        group = self.fmt.group_size if quant == "int4-awq" else AWQ_GROUP_SIZE
        return QuantConfig(quant=quant, kv_cache=kv, awq_group_size=group).quantization_block()

    @property
    def summary(self) -> str:
        """What the conversion did, for the build's notes (after ``apply`` has seen every item)."""
        if self.fmt.quant_algo == "W4A16_AWQ":
            return ("packed int4 weights, group scales and pre_quant_scale carried over (ones where the export "
                    "folded it into the norm)")
        return (f"e4m3 weights and scales carried over; {self.num_rescaled} fused q/k/v or gate/up module(s) with "
                "unequal weight scales rescaled to their largest, as TensorRT-LLM's loader does")

    def source_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The stored shape of the source ``name`` whose values have ``shape``: packed int4 weights hold two rows
        per byte.

        Arguments:
            name: the HF tensor name; shape: the shape of its unpacked values.
        """
        if self.fmt.quant_algo == "W4A16_AWQ" and f"{name.removesuffix('.weight')}.weight_scale" in self.scales:
            return (shape[0] // 2, *shape[1:])
        return shape

    def apply(self, item: WorkItem, shards: list[list[torch.Tensor]]) -> list[list[tuple[str, list[torch.Tensor]]]]:
        """Per TP rank, (name, parts) in ``trtllm_kit.layout.quant_entries`` order.

        Arguments:
            item: the work item; shards: per TP rank the parts (one per HF source) of its tensor.
        """
        module = layer_module(item.rule)
        if module not in LINEARS:
            return [[(item.target, parts)] for parts in shards]
        outputs = self._fp8(item, module, shards) if self.fmt.quant_algo == "FP8" else self._awq(item, shards)
        if module == "attention.qkv" and self.fmt.kv_cache_quant_algo == "FP8":
            name = item.target[: -len("attention.qkv.weight")] + KV_SCALE_NAME
            for rank in outputs:
                rank.append((name, [self.kv_scale(item)]))
        return outputs

    def _fp8(self, item: WorkItem, module: str, shards: list[list[torch.Tensor]]) -> Outputs:
        """The e4m3 bytes, each fused group at its largest weight scale and input scale (``fp8_fused``)."""
        group = [name for kind in FUSED.get(module, (module,))
                 for name in self.modules[kind].source_names(item.layer)]
        weight_scales = [self.scale(name, "weight_scale") for name in item.sources]
        group_weight = [self.scale(name, "weight_scale") for name in group]
        group_input = [self.scale(name, "input_scale") for name in group]
        prefix = item.target.removesuffix(".weight")
        outputs = []
        for parts in shards:
            rescaled, max_weight, max_input = fp8_fused(parts, weight_scales, group_weight, group_input, self.dtype)
            outputs.append([(item.target, rescaled),
                            (f"{prefix}.weights_scaling_factor", [max_weight.reshape(1)]),
                            (f"{prefix}.activation_scaling_factor", [max_input.reshape(1)])])
        self.num_rescaled += int(any(not torch.equal(s, max_weight) for s in weight_scales))
        return outputs

    def _awq(self, item: WorkItem, shards: list[list[torch.Tensor]]) -> Outputs:
        """The packed bytes, the group ``weight_scale`` rows (or columns, row-parallel) of the rank's part, and
        the ``pre_quant_scale`` where the input keeps one; ModelOpt's unified export folded q/k/v's and gate/up's
        shared scale into the norm before them, which the checkpoint carries as it is, so theirs is ones."""
        tp_size, split = len(shards), item.rule.split
        weight_scales = [self.scales[f"{name.removesuffix('.weight')}.weight_scale"] for name in item.sources]
        kept = {self.scales.get(f"{name.removesuffix('.weight')}.pre_quant_scale") is None for name in item.sources}
        pre = self.scales.get(f"{item.sources[0].removesuffix('.weight')}.pre_quant_scale")
        if len(kept) != 1 or (pre is not None and not all(
                torch.equal(pre, self.scales[f"{n.removesuffix('.weight')}.pre_quant_scale"]) for n in item.sources)):
            raise KitUsageError(f"the {self.fmt.label} checkpoint gives {', '.join(item.sources)} different "
                                f"pre_quant_scale tensors, which {item.target} must share: export it again.")
        if pre is None:
            pre = torch.ones(weight_scales[0].shape[1] * self.fmt.group_size)
        outputs = []
        for tp_rank, parts in enumerate(shards):
            if split is Split.QKV:
                scales = qkv_parts(weight_scales, self.num_kv_heads, tp_size, tp_rank)
            else:
                scales = [shard(scale, split, tp_size, tp_rank) for scale in weight_scales]
            for part, scale in zip(parts, scales, strict=True):
                if (part.shape[0] * 2, part.shape[1]) != (scale.shape[0], scale.shape[1] * self.fmt.group_size):
                    raise KitUsageError(f"a rank's part of {item.target} would hold {part.shape[0] * 2} x "
                                        f"{part.shape[1]} int4 weights but {scale.shape[0]} x {scale.shape[1]} group "
                                        f"scales: W4A16 AWQ splits whole bytes of two rows and groups of "
                                        f"{self.fmt.group_size} input features, so choose another --tp.")
            rank_pre = torch.chunk(pre, tp_size)[tp_rank] if split is Split.ROW else pre
            prefix = item.target.removesuffix(".weight")
            outputs.append([(item.target, [part.to(torch.uint8).view(torch.int8) for part in parts]),
                            (f"{prefix}.weights_scaling_factor", [torch.cat(scales)]),
                            (f"{prefix}.prequant_scaling_factor", [rank_pre.to(self.dtype)])])
        return outputs

    def scale(self, weight: str, kind: str) -> torch.Tensor:
        """The float32 scalar ``kind`` scale of the HF linear whose weight is ``weight``."""
        return self.scales[f"{weight.removesuffix('.weight')}.{kind}"].reshape(())

    def kv_scale(self, item: WorkItem) -> torch.Tensor:
        """``max(k_scale, v_scale, 1.0)`` of the item's layer (``quant/kv.py``)."""
        names = kv_scale_names(self.scales, item.sources[0])
        return kv_scale_tensor(fp8_kv_scale_of(float(self.scales[names["k_scale"][0]]),
                                               float(self.scales[names["v_scale"][0]])))


def _read_scales(model: ModelSpec) -> dict[str, torch.Tensor]:
    """Every scale tensor of the checkpoint (small next to the weights), in float32 (``pre_quant_scale`` as it is)."""
    scales = {}
    for path in model.weight_files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                if name.endswith(SCALE_SUFFIXES) and model.tensors[name].path == path:
                    tensor = f.get_tensor(name)
                    scales[name] = tensor if name.endswith("pre_quant_scale") else tensor.to(F32)
    return scales
