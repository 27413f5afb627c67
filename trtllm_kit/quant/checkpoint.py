"""The converter's quantization hook: given one work item's per-rank shards and the calibration statistics,
the tensors each rank file holds instead (quantized weights, scales, smoothed norms, KV-cache scales).

``trtllm_kit.layout.quant_entries`` states the layout (names, dtypes, shapes) before any data moves; ``apply``
produces the data in that order. It sees a tensor by its TensorRT-LLM name; the HF modules behind it come from
the family's weight table.
"""

from __future__ import annotations

from typing import Any

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import KV_SCALE_NAME, LAYER_RULE_PREFIX, LINEARS, NORM_INPUTS, ROW_LINEARS
from trtllm_kit.models.base import Place, Rule, Split, WorkItem
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.awq import group_scales, int4_pack
from trtllm_kit.quant.awq_fold import TRTLLM, AwqFold
from trtllm_kit.quant.blocks import BlockBuffer
from trtllm_kit.quant.calibrate import CalibrationStats
from trtllm_kit.quant.fp8 import fp8_quantize, fp8_scale
from trtllm_kit.quant.int8 import INT8_MAX, quantize_rows_int8, smoothed_row_amax, smoothing_scales
from trtllm_kit.quant.kv import fp8_kv_scale, int8_kv_scale, kv_scale_tensor

F32 = torch.float32
Outputs = list[list[tuple[str, list[torch.Tensor]]]]


class QuantTransform:
    """Per-work-item quantization for one conversion.

    Arguments:
        config: the quantization; rules: the family's weight table for this model; dtype: the checkpoint dtype;
        stats: calibration statistics (``apply`` needs them unless the config needs none).
    """

    def __init__(self, config: QuantConfig, rules: list[Rule], dtype: torch.dtype,
                 stats: CalibrationStats | None) -> None:
        self.config = config
        self.dtype = dtype
        self.stats = stats or CalibrationStats()
        self.buffer = BlockBuffer()
        self.modules = {r.name.removeprefix(LAYER_RULE_PREFIX).removesuffix(".weight"): r
                        for r in rules if r.place is Place.LAYER and r.name.endswith(".weight")}

    @property
    def quantization(self) -> dict[str, Any]:
        return self.config.quantization_block()

    def source_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Plain sources are stored as their values' shape."""
        return shape

    def hf_modules(self, kind: str, layer: int | None) -> list[str]:
        """The HF module names behind a TensorRT-LLM layer module (three for qkv)."""
        assert layer is not None, "quantization statistics belong to decoder layers"
        return [name.removesuffix(".weight") for name in self.modules[kind].source_names(layer)]

    def stat(self, what: str, kinds: tuple[str, ...], layer: int | None) -> torch.Tensor:
        """One statistic reduced (elementwise max) over the HF modules of ``kinds`` (same-length vectors)."""
        values = [self.stats.get(what, m) for kind in kinds for m in self.hf_modules(kind, layer)]
        return torch.stack(values).amax(0) if len({v.numel() for v in values}) == 1 else torch.cat(values)

    def smoother(self, kinds: tuple[str, ...], layer: int | None) -> torch.Tensor:
        """The SmoothQuant scales of the linears that share one input."""
        x = self.stat("x", kinds[:1], layer)
        wc = torch.stack([self.stat("wc", (k,), layer) for k in kinds]).amax(0)
        return smoothing_scales(x, wc, self.config.smoothquant_alpha)

    @staticmethod
    def _kind(item: WorkItem) -> tuple[str, str]:
        """(module, parameter) of a layer tensor: ``attention.qkv``, ``weight``; ("", name) for others."""
        if item.rule.place is not Place.LAYER:
            return "", item.rule.name
        module, _, param = item.rule.name.removeprefix(LAYER_RULE_PREFIX).rpartition(".")
        return module, param

    def apply(self, item: WorkItem, shards: list[list[torch.Tensor]]) -> Outputs:
        """Per TP rank, (name, parts) in ``trtllm_kit.layout.quant_entries`` order.

        Arguments:
            item: the work item; shards: per TP rank the parts that concatenate (dim 0) to its plain tensor.
        """
        if self.config.needs_calibration and not self.stats.x:
            raise ValueError(f"--quant {self.config.quant} --kv-cache {self.config.kv_cache} needs calibration")
        module, param = self._kind(item)
        quant, layer = self.config.quant, item.layer
        if quant == "fp8" and module in LINEARS and param == "weight":
            outputs = self._fp8(item, module, shards)
        elif quant == "int4-awq" and module in LINEARS and param == "weight":
            outputs = self._awq(item, module, shards)
        elif quant == "int8-sq" and module in NORM_INPUTS and param == "weight":
            outputs = self._sq_norm(item, module, shards)
        elif quant == "int8-sq" and module in LINEARS and param == "weight":
            outputs = self._sq_linear(item, module, shards)
        else:
            outputs = [[(item.target, parts)] for parts in shards]
        if self.config.kv_cache_quant_algo and module == "attention.qkv" and param == "weight":
            name = item.target[: -len("attention.qkv.weight")] + KV_SCALE_NAME
            scale = kv_scale_tensor(self._kv_scale(layer))
            for rank in outputs:
                rank.append((name, [scale]))
        return outputs

    def _kv_scale(self, layer: int | None) -> float:
        q, k, v = self.hf_modules("attention.qkv", layer)
        y = {m: float(self.stats.get("y", m).max()) for m in (q, k, v)}
        if self.config.kv_cache_quant_algo == "INT8":
            return int8_kv_scale(max(y.values()))
        return fp8_kv_scale(y[k], y[v])

    def _fp8(self, item: WorkItem, module: str, shards: list[list[torch.Tensor]]) -> Outputs:
        """One shared scale per fused group: q/k/v are one item; fc and gate share their max
        (docs/trtllm-checkpoint.md §5.5)."""
        group = ("mlp.fc", "mlp.gate") if module in ("mlp.fc", "mlp.gate") else (module,)
        w_amax = float(self.stat("w", group, item.layer).max())
        x_amax = float(self.stat("x", group[:1], item.layer).max())
        wsf, asf = fp8_scale(w_amax), fp8_scale(x_amax)
        prefix = item.target.rsplit(".", 1)[0]
        scales = [(f"{prefix}.weights_scaling_factor", [torch.tensor([wsf], dtype=F32)]),
                  (f"{prefix}.activation_scaling_factor", [torch.tensor([asf], dtype=F32)])]
        return [[(item.target, [fp8_quantize(p, wsf, self.buffer) for p in parts]), *scales] for parts in shards]

    def _awq(self, item: WorkItem, module: str, shards: list[list[torch.Tensor]]) -> Outputs:
        """Packed int4 weights, group ``weights_scaling_factor`` and ``prequant_scaling_factor`` per rank, as
        ModelOpt's TensorRT-LLM export writes them (``quant/awq_fold.py``: q/k/v share one scale, nothing is
        folded into the norms). A row-parallel rank takes its input features' part of the scales."""
        fold = AwqFold(self.stats, self.dtype, TRTLLM)
        sources = self.hf_modules(module, item.layer)
        is_row = item.rule.split is Split.ROW
        prefix = item.target.rsplit(".", 1)[0]
        outputs = []
        group = self.config.awq_group_size
        for tp_rank, parts in enumerate(shards):
            columns = slice(None)
            if is_row:
                width = parts[0].shape[1]
                columns = slice(tp_rank * width, (tp_rank + 1) * width)
            packed, scales = [], []
            for source, part in zip(sources, parts, strict=True):
                if part.shape[0] % 2 or part.shape[1] % group:
                    raise KitUsageError(f"--quant int4-awq packs two output rows per byte and scales groups of "
                                        f"{group} input features, but a rank's part of {item.target} is "
                                        f"{part.shape[0]} x {part.shape[1]}; choose another --tp or --quant fp8.")
                weight = fold.weight(source, part.to(self.dtype), columns)
                scale = group_scales(weight, group)
                packed.append(int4_pack(weight, scale).view(torch.int8))
                scales.append(scale)
            outputs.append([(item.target, [torch.cat(packed)]),
                            (f"{prefix}.weights_scaling_factor", [torch.cat(scales)]),
                            (f"{prefix}.prequant_scaling_factor", [fold.shared_scale(sources[0])[columns]])])
        return outputs

    def _sq_norm(self, item: WorkItem, module: str, shards: list[list[torch.Tensor]]) -> Outputs:
        """The norm before qkv (or fc/gate) divided by the smoother, and its ``scale_to_int``."""
        kinds = NORM_INPUTS[module]
        s = self.smoother(kinds, item.layer)
        if self.config.per_token:
            scale_to_int = 1.0
        else:
            scale_to_int = INT8_MAX / float((self.stat("x", kinds[:1], item.layer) / s).max())
        prefix = item.target.rsplit(".", 1)[0]
        outputs = []
        for parts in shards:
            weight = (parts[0].float() / s).to(self.dtype)
            outputs.append([(item.target, [weight]),
                            (f"{prefix}.scale_to_int", [torch.tensor([scale_to_int], dtype=F32)])])
        return outputs

    def _sq_linear(self, item: WorkItem, module: str, shards: list[list[torch.Tensor]]) -> Outputs:
        """int8 weights and the scale tensors of docs/trtllm-checkpoint.md §5.3 step 4, split per step 5."""
        layer, cfg = item.layer, self.config
        is_row = item.rule.split is Split.ROW
        kinds = ("mlp.fc", "mlp.gate") if module in ("mlp.fc", "mlp.gate") else (module,)
        s = self.smoother(kinds, layer)
        s_ranks = list(torch.chunk(s, len(shards))) if is_row else [s] * len(shards)
        # per output row amax of the smoothed weight; a row-parallel row spans every rank's columns
        amax = [[smoothed_row_amax(p, sr, self.buffer) for p in parts]
                for parts, sr in zip(shards, s_ranks, strict=True)]
        if is_row:
            full = torch.stack([a[0] for a in amax]).amax(0)
            amax = [[full] for _ in amax]
        if cfg.per_channel:
            w_scale = [[INT8_MAX / a.clamp(min=1e-8) for a in ranks] for ranks in amax]
        else:  # per tensor; for qkv per q/k/v part, each over all ranks
            per_part = [max(float(ranks[i].max()) for ranks in amax) for i in range(len(amax[0]))]
            w_scale = [[torch.full_like(a, INT8_MAX / max(m, 1e-8)) for a, m in zip(ranks, per_part, strict=True)]
                       for ranks in amax]
        x_amax = float((self.stat("x", kinds[:1], layer) / s).max())
        y_amax = float(self.stat("y", ("attention.qkv",) if module == "attention.qkv" else (module,), layer).max())
        scale_x = INT8_MAX / max(x_amax, 1e-8)
        scale_y = INT8_MAX / max(y_amax, 1e-8)
        prefix = item.target.rsplit(".", 1)[0]
        base = item.target[: -len(f"{module}.weight")]
        outputs = []
        for parts, sr, scales in zip(shards, s_ranks, w_scale, strict=True):
            weight = [quantize_rows_int8(p, sc, sr, self.buffer) for p, sc in zip(parts, scales, strict=True)]
            row_scale = torch.cat(scales)
            if is_row:
                row_scale = row_scale if cfg.per_channel else row_scale[:1]
            elif module != "attention.qkv" and not cfg.per_channel:
                row_scale = row_scale[:1]
            channel = 1.0 / row_scale if cfg.per_token else scale_y / (scale_x * row_scale)
            rank = [(item.target, weight), (f"{prefix}.per_channel_scale", [channel.reshape(1, -1).to(F32)])]
            if not cfg.per_token:
                rank.append((f"{prefix}.act_scale", [torch.tensor([[1.0 / scale_y]], dtype=F32)]))
            if is_row:
                rank.append((f"{prefix}.smoother", [sr.reshape(1, -1).to(F32).contiguous()]))
                if not cfg.per_token:
                    rank.append((base + ROW_LINEARS[module], [torch.tensor([scale_x], dtype=F32)]))
            outputs.append(rank)
        return outputs

