"""Aggregated or disaggregated, and the prefill:decode ratio, modelled from the memory plan and GPU rooflines, or
from per-phase figures ``bench --phases`` measured on a served artifact (``MeasuredPhases``).

Modelled, every figure comes from the model's shapes, its precision and a GPU's datasheet peaks derated by fixed
efficiencies (``MFU``, ``MBU``). For one worker of ``tp`` GPUs (``F`` = tp x peak FLOP/s x MFU,
``B`` = tp x HBM bytes/s x MBU, ``W`` weight bytes, ``k`` KV bytes per token, ``N`` parameters)::

    prefill    P    = F / (2N + 2 L d_attn ISL)                 tokens/s; TTFT = ISL / P (+ ISL k / LINK, disagg)
    decode     t(b) = (W + b k (ISL + OSL/2)) / B               seconds per step at batch b
               b    = min(MAX_BATCH, KV room / (k (ISL+OSL)), largest b with t(b) <= ITL)
               D    = b / t(b)                                  tokens/s
    ratio      prefill workers per decode worker = (D / OSL) / (P / ISL)
    aggregated a step may carry a prefill chunk c = min(ISL, MAX_NUM_TOKENS): b_agg is the largest b with
               t(b) + c / P <= ITL; requests/s = 1 / (ISL / P + OSL t(b_agg) / b_agg)

Measured, ``P`` is the prefill tokens/s at the measured batch and ``D = c r`` at the measured decode concurrency
``c`` with ``r`` tokens/s per sequence; ``t(b)`` is the measured step ``1 / r`` at ``b = c`` (one worker as served,
TTFT with the measured KV transfer); the aggregated alternative runs that step plus a prefill chunk.

Disaggregated is recommended when aggregated cannot meet the ITL target at any batch, or when the whole-worker
xPyD unit gives more output tokens/s per GPU than aggregated by more than ``DISAGG_MARGIN``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GPU
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.plan import MAX_BATCH_SIZE, MAX_NUM_TOKENS, kv_bytes_per_token
from trtllm_kit.precision import ITEMSIZE, Precision

# datasheet peaks per GPU: (HBM bytes/s, dense 16-bit FLOP/s, dense FP8 FLOP/s or None)
ROOFLINE: dict[str, tuple[float, float, float | None]] = {
    "H100-80GB": (3.35e12, 989e12, 1979e12),
    "H100-NVL": (3.9e12, 835e12, 1671e12),
    "H200": (4.8e12, 989e12, 1979e12),
    "B200": (8.0e12, 2250e12, 4500e12),
    "A100-80GB": (2.039e12, 312e12, None),
    "L40S": (0.864e12, 362e12, 733e12),
}
MFU = 0.5  # share of peak FLOP/s a prefill reaches
MBU = 0.7  # share of HBM bandwidth a decode step reaches
KV_FRACTION = 0.9  # of the memory left after the weights
WEIGHT_SHARE = 0.6  # a worker's TP is the smallest power of two whose weight shard fits in this share of a GPU
LINK_BYTES_S = 50e9  # KV transfer between workers: one 400 Gb/s NIC
DISAGG_MARGIN = 0.10  # disaggregation must beat aggregated per GPU by this much to pay for its second pool
TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Workload:
    """Input and output lengths (tokens) and the latency targets (seconds)."""

    isl: int
    osl: int
    ttft_s: float
    itl_s: float

    def __post_init__(self) -> None:
        if min(self.isl, self.osl) < 1 or min(self.ttft_s, self.itl_s) <= 0:
            raise KitUsageError(f"--isl {self.isl}, --osl {self.osl}, --ttft-slo and --itl-slo must be positive.")


@dataclass(frozen=True)
class MeasuredPhases:
    """What ``bench --phases`` measured on one served worker (its ``phases.json``)."""

    prefill_batch: int
    isl: int
    prefill_tokens_s: float
    ttft_ms_p50: float
    decode_concurrency: int
    osl: int
    decode_tokens_s_per_seq: float
    itl_ms_p50: float
    kv_transfer_ms_per_request: float | None = None  # a disaggregated serve's, from its transfer gauges
    num_kv_transfers: int = 0

    def __post_init__(self) -> None:
        if min(self.prefill_tokens_s, self.decode_tokens_s_per_seq) <= 0 or self.decode_concurrency < 1:
            raise KitUsageError(f"the measured phases hold no positive throughput (prefill {self.prefill_tokens_s} "
                                f"tokens/s, decode {self.decode_tokens_s_per_seq} tokens/s per sequence); measure "
                                "again with trtllm-kit bench --phases.")

    @classmethod
    def read(cls, path: Path) -> MeasuredPhases:
        """Read a ``phases.json``; a file that is not one says so in one sentence.

        Arguments:
            path: the file ``bench --phases`` wrote.
        """
        try:
            values = json.loads(Path(path).read_text())
            return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
        except (OSError, ValueError, TypeError) as exc:
            raise KitUsageError(f"{path} is not a phases.json of trtllm-kit bench --phases ({exc}); write one with "
                                "trtllm-kit bench --phases --out DIR.") from None


@dataclass(frozen=True)
class DisaggPlan:
    """The modelled figures of both phases, the aggregated alternative, and the recommendation."""

    gpu: str
    tp_size: int
    weight_bytes: int
    kv_bytes_per_token: int
    flops_per_token: float
    prefill_tokens_s: float
    ttft_s: float
    ttft_disagg_s: float
    decode_batch: int
    decode_step_s: float
    decode_tokens_s: float
    prefill_per_decode: float
    prefill_workers: int
    decode_workers: int
    disagg_tokens_s_per_gpu: float
    agg_batch: int
    agg_tokens_s_per_gpu: float
    ttft_met: bool
    recommendation: str
    measured: bool = False

    def to_dict(self) -> dict[str, Any]:
        if self.measured:
            return {**asdict(self), "modelled": False}
        return {**asdict(self), "modelled": True, "mfu": MFU, "mbu": MBU, "link_bytes_s": LINK_BYTES_S}


def roofline(gpu: GPU, precision: Precision) -> tuple[float, float]:
    """(HBM bytes/s, peak FLOP/s at the weights' precision) of one GPU."""
    figures = ROOFLINE.get(gpu.name)
    if figures is None:
        raise KitUsageError(f"the plan has no roofline figures for {gpu.name}; use --gpu with one of "
                            f"{', '.join(ROOFLINE)}.")
    bandwidth, bf16, fp8 = figures
    return bandwidth, fp8 if precision.activation_dtype == "fp8" and fp8 else bf16


def worker_tp(weight_bytes: int, gpu: GPU) -> int:
    """The smallest TP whose weight shard fits ``WEIGHT_SHARE`` of one GPU."""
    for tp in TP_CHOICES:
        if weight_bytes / tp <= WEIGHT_SHARE * gpu.memory_bytes:
            return tp
    raise KitUsageError(f"{weight_bytes / 1e9:.0f} GB of weights do not fit {max(TP_CHOICES)} x {gpu.name}.")


def _batch(itl_budget_s: float, weight_bytes: int, kv_token: int, context: float, bandwidth: float,
           kv_room_batch: int) -> int:
    by_itl = math.floor((itl_budget_s * bandwidth - weight_bytes) / (kv_token * context))
    return max(0, min(MAX_BATCH_SIZE, kv_room_batch, by_itl))


def plan_disagg(hf: HFConfig, precision: Precision, gpu: GPU, work: Workload) -> DisaggPlan:
    """The modelled plan (the module's formula) for ``hf`` at ``precision`` on ``gpu``.

    Arguments:
        hf: the model's config; precision: weights and KV cache; gpu: the GPU; work: lengths and targets.
    """
    weight_item = 1 if precision.weight_dtype in ("fp8", "int8") else ITEMSIZE[precision.dtype]
    weights = hf.num_parameters * weight_item
    kv_token = kv_bytes_per_token(hf.num_hidden_layers, hf.num_key_value_heads, hf.head_dim, precision.kv_bytes)
    tp = worker_tp(weights, gpu)
    hbm, peak = roofline(gpu, precision)
    flops, bandwidth = tp * peak * MFU, tp * hbm * MBU
    flops_token = 2 * hf.num_parameters + 2 * hf.num_hidden_layers * hf.num_attention_heads * hf.head_dim * work.isl
    prefill = flops / flops_token
    context = work.isl + work.osl / 2
    room = math.floor((tp * gpu.memory_bytes - weights) * KV_FRACTION / (kv_token * (work.isl + work.osl)))

    def step(batch: int) -> float:
        return (weights + batch * kv_token * context) / bandwidth

    decode_batch = _batch(work.itl_s, weights, kv_token, context, bandwidth, room)
    if decode_batch < 1:
        raise KitUsageError(f"no decode batch meets --itl-slo {work.itl_s * 1e3:g} ms on {tp} x {gpu.name} (one "
                            f"step reads {weights / 1e9:.0f} GB: {step(1) * 1e3:.1f} ms); relax the target.")
    chunk_s = min(work.isl, MAX_NUM_TOKENS) / prefill
    agg_batch = _batch(work.itl_s - chunk_s, weights, kv_token, context, bandwidth, room)
    return _decide(work, gpu.name, tp, prefill, decode_batch, step(decode_batch), agg_batch,
                   step(agg_batch) if agg_batch else 0.0, work.isl * kv_token / LINK_BYTES_S,
                   weight_bytes=weights, kv_bytes_per_token=kv_token, flops_per_token=flops_token)


def plan_measured(phases: MeasuredPhases, work: Workload) -> DisaggPlan:
    """The plan from ``bench --phases`` figures (the module's measured formula), for one worker as served.

    Arguments:
        phases: the measured figures; work: lengths and targets.
    """
    step_s = 1 / phases.decode_tokens_s_per_seq
    chunk_s = min(work.isl, MAX_NUM_TOKENS) / phases.prefill_tokens_s
    agg_batch = phases.decode_concurrency if step_s + chunk_s <= work.itl_s else 0
    transfer_s = (phases.kv_transfer_ms_per_request or 0.0) / 1e3
    return _decide(work, "measured", 1, phases.prefill_tokens_s, phases.decode_concurrency, step_s, agg_batch,
                   step_s, transfer_s, measured=True)


def _decide(work: Workload, gpu: str, tp: int, prefill: float, decode_batch: int, step_s: float, agg_batch: int,
            agg_step_s: float, transfer_s: float, **figures: Any) -> DisaggPlan:
    """The ratio, both alternatives per GPU and the recommendation from the phases' figures."""
    decode = decode_batch / step_s
    ratio = (decode / work.osl) / (prefill / work.isl)
    workers = (max(1, round(ratio)), 1) if ratio >= 1 else (1, max(1, round(1 / ratio)))
    unit_requests = min(workers[0] * prefill / work.isl, workers[1] * decode / work.osl)
    disagg_per_gpu = unit_requests * work.osl / (sum(workers) * tp)
    agg_per_gpu = work.osl / (work.isl / prefill + work.osl * agg_step_s / agg_batch) / tp if agg_batch else 0.0
    disagg = agg_batch < 1 or disagg_per_gpu > agg_per_gpu * (1 + DISAGG_MARGIN)
    ttft_disagg = work.isl / prefill + transfer_s
    return DisaggPlan(
        gpu=gpu, tp_size=tp, weight_bytes=figures.get("weight_bytes", 0),
        kv_bytes_per_token=figures.get("kv_bytes_per_token", 0), flops_per_token=figures.get("flops_per_token", 0.0),
        prefill_tokens_s=prefill, ttft_s=work.isl / prefill, ttft_disagg_s=ttft_disagg, decode_batch=decode_batch,
        decode_step_s=step_s, decode_tokens_s=decode, prefill_per_decode=ratio,
        prefill_workers=workers[0], decode_workers=workers[1], disagg_tokens_s_per_gpu=disagg_per_gpu,
        agg_batch=agg_batch, agg_tokens_s_per_gpu=agg_per_gpu,
        ttft_met=(ttft_disagg if disagg else work.isl / prefill) <= work.ttft_s,
        recommendation="disaggregated" if disagg else "aggregated", measured=bool(figures.get("measured")))


def describe(plan: DisaggPlan, work: Workload) -> list[str]:
    """The plan as text: the figures, each with the formula term it fills, and the recommendation."""
    tp = plan.tp_size
    targets = f"ISL {work.isl}, OSL {work.osl}, TTFT <= {work.ttft_s * 1e3:g} ms, ITL <= {work.itl_s * 1e3:g} ms"
    head = [f"measured (bench --phases, one worker as served): {targets}"] if plan.measured else [
        f"modelled (no measurement): {tp} x {plan.gpu} per worker, MFU {MFU}, MBU {MBU}, {targets}",
        f"  weights W = {plan.weight_bytes / 1e9:.2f} GB, KV k = {plan.kv_bytes_per_token} B/token, "
        f"2N + 2 L d_attn ISL = {plan.flops_per_token / 1e9:.1f} GFLOP/token"]
    source = "measured" if plan.measured else "F / FLOP per token"
    return [
        *head,
        f"  prefill P = {source} = {plan.prefill_tokens_s:,.0f} tokens/s; TTFT {plan.ttft_s * 1e3:.1f} ms "
        f"aggregated, {plan.ttft_disagg_s * 1e3:.1f} ms with the KV transfer",
        f"  decode b = {plan.decode_batch}, t(b) = {plan.decode_step_s * 1e3:.1f} ms, D = b / t(b) = "
        f"{plan.decode_tokens_s:,.0f} tokens/s",
        f"  prefill per decode worker = (D / OSL) / (P / ISL) = {plan.prefill_per_decode:.3f} -> "
        f"{plan.prefill_workers}P{plan.decode_workers}D: {plan.disagg_tokens_s_per_gpu:,.0f} output tokens/s/GPU",
        f"  aggregated: b_agg = {plan.agg_batch} -> {plan.agg_tokens_s_per_gpu:,.0f} output tokens/s/GPU" +
        ("" if plan.agg_batch else " (a step carrying a prefill chunk exceeds the ITL target at any batch)"),
        f"recommended: {plan.recommendation}" +
        (f" ({plan.prefill_workers} prefill : {plan.decode_workers} decode workers of tp {tp})"
         if plan.recommendation == "disaggregated" else "") +
        ("" if plan.ttft_met else "; the TTFT target is not met at this TP (raise the prefill TP)"),
    ]
