"""The engine's counters (``ExecutorStats``) as each transport names them, stated as data: Triton's
``nv_trt_llm_*`` gauge families (the C++ backend's names, plus the kit's batch family) and the C++ executor's
iteration statistics JSON (what ``LLM.get_stats`` returns upstream).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class ExecutorStats:
    """A snapshot in the spirit of the ``nv_trt_llm_*`` metrics (request, KV block and batcher families)."""

    active: int
    waiting: int
    max: int
    scheduled: int
    context: int
    generation_requests: int
    total_context_tokens: int
    step_tokens: int
    blocks_max: int
    blocks_free: int
    blocks_used: int
    tokens_per_block: int
    blocks_reused: int
    blocks_missed: int
    preemptions: int
    iteration_counter: int
    total_scheduled_requests: int
    peak_scheduled: int
    timestamp: float


GAUGES: dict[str, tuple[str, dict[str, str]]] = {  # family → (label name, ExecutorStats field per label value)
    "nv_trt_llm_request_metrics": ("request_type", {"active": "active", "max": "max", "scheduled": "scheduled",
                                                    "context": "context", "waiting": "waiting"}),
    "nv_trt_llm_kv_cache_block_metrics": ("kv_cache_block_type", {
        "max": "blocks_max", "free": "blocks_free", "used": "blocks_used", "tokens_per": "tokens_per_block",
        "reused": "blocks_reused", "missed": "blocks_missed", "fraction": "blocks_fraction"}),
    "nv_trt_llm_inflight_batcher_metrics": ("inflight_batcher_specific_metric", {
        "total_context_tokens": "total_context_tokens", "generation_requests": "generation_requests",
        "paused_requests": "preemptions"}),
    "nv_trt_llm_general_metrics": ("general_type", {"iteration_counter": "iteration_counter",
                                                    "timestamp": "timestamp"}),
    "trtllm_kit_batch_metrics": ("batch_metric", {"total_scheduled_requests": "total_scheduled_requests",
                                                  "peak_scheduled": "peak_scheduled", "step_tokens": "step_tokens"}),
}
EXECUTOR_KEYS: dict[str, Any] = {  # the executor's JSON key → ExecutorStats field, or a nested object of them
    "iter": "iteration_counter", "numActiveRequests": "active", "maxNumActiveRequests": "max",
    "numQueuedRequests": "waiting",
    "kvCacheStats": {"maxNumBlocks": "blocks_max", "freeNumBlocks": "blocks_free", "usedNumBlocks": "blocks_used",
                     "tokensPerBlock": "tokens_per_block", "reusedBlocks": "blocks_reused",
                     "missedBlocks": "blocks_missed"},
    "inflightBatchingStats": {"numScheduledRequests": "scheduled", "numContextRequests": "context",
                              "numGenRequests": "generation_requests", "numPausedRequests": "preemptions",
                              "numCtxTokens": "total_context_tokens"},
}


def gauge_values(stats: ExecutorStats) -> dict[str, float]:
    """Each gauge's value by ``ExecutorStats`` field, with ``blocks_fraction`` (the C++ backend's "fraction": used
    over all blocks).

    Arguments:
        stats: the engine's counters after a step.
    """
    values = {name: float(value) for name, value in asdict(stats).items()}
    values["blocks_fraction"] = values["blocks_used"] / max(values["blocks_max"], 1.0)
    return values


def executor_stats(stats: ExecutorStats) -> dict[str, Any]:
    """One iteration's statistics under the C++ executor's JSON keys.

    Arguments:
        stats: the engine's counters after a step.
    """
    values = asdict(stats)

    def keyed(keys: dict[str, Any]) -> dict[str, Any]:
        return {key: keyed(field) if isinstance(field, dict) else values[field] for key, field in keys.items()}

    return keyed(EXECUTOR_KEYS)
