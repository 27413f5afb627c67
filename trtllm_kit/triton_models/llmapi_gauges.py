"""The llmapi model's custom metrics: the C++ backend's gauges (``nv_trt_llm_request_metrics``,
``nv_trt_llm_kv_cache_block_metrics``) and the CPU runtime's cache transceiver's, read from the newest
``LLM.get_stats()`` iteration (the C++ executor's JSON keys).
"""

from __future__ import annotations

from typing import Any

GAUGES: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {  # family → (label, {label value: key path})
    "nv_trt_llm_request_metrics": ("request_type", {
        "active": ("numActiveRequests",), "max": ("maxNumActiveRequests",), "waiting": ("numQueuedRequests",),
        "scheduled": ("inflightBatchingStats", "numScheduledRequests"),
        "context": ("inflightBatchingStats", "numContextRequests")}),
    "nv_trt_llm_kv_cache_block_metrics": ("kv_cache_block_type", {
        "max": ("kvCacheStats", "maxNumBlocks"), "free": ("kvCacheStats", "freeNumBlocks"),
        "used": ("kvCacheStats", "usedNumBlocks"), "tokens_per": ("kvCacheStats", "tokensPerBlock")}),
    "trtllm_kit_kv_transfer_metrics": ("kv_transfer_type", {  # the CPU runtime's cache transceiver
        "held": ("kvTransferStats", "numHeldRequests"), "transfers": ("kvTransferStats", "numTransfers"),
        "seconds": ("kvTransferStats", "transferSeconds")}),
}


def stat_value(stats: Any, path: tuple[str, ...]) -> float:
    """The number at ``path`` in one iteration's statistics (0 where it is missing).

    Arguments:
        stats: one ``get_stats()`` entry (a JSON object); path: its keys, outermost first.
    """
    value = stats
    for key in path:
        value = value.get(key, 0) if isinstance(value, dict) else 0
    return float(value or 0)


def make_gauges(pb_utils: Any, labels: dict[str, str]) -> tuple[list[Any], list[tuple[tuple[str, ...], Any]]]:
    """The metric families (the caller keeps them: a family must outlive its metrics) and each gauge with its
    statistics key path.

    Arguments:
        pb_utils: Triton's backend module; labels: the labels every gauge carries (model, version, instance).
    """
    families: list[Any] = []
    gauges: list[tuple[tuple[str, ...], Any]] = []
    for family, (label, values) in GAUGES.items():
        metric_family = pb_utils.MetricFamily(name=family, description=f"TensorRT-LLM {label} (LLM.get_stats)",
                                              kind=pb_utils.MetricFamily.GAUGE)
        families.append(metric_family)
        gauges += [(path, metric_family.Metric(labels={**labels, label: value})) for value, path in values.items()]
    return families, gauges
