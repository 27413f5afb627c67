"""Alert rules over the series the serving pods export: a queue the autoscaler is not keeping up with, server
errors, time to first token over its objective, a full KV cache.

Each alert is a signal (PromQL over the deployment's series) compared with a threshold for a while. The error
rate and the TTFT read the kit's OpenAI frontend (``trtllm_kit_openai_*``) and the KV cache the C++ backend's
gauge, which only the Triton layouts export; a multi-node ``trtllm-serve`` leader gets the queue alert only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.deploy.monitoring import selector, waiting_series
from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.serving import TRITON, Serving

Obj = dict[str, Any]
QUEUE_FACTOR = 2.0  # waiting requests per pod, in queue targets, that the autoscaler should have absorbed
ERROR_FRACTION = 0.05  # of generation requests answered 5xx
KV_CACHE_FULL = 0.95  # fraction of KV-cache blocks in use
TTFT_QUANTILE = 0.9


@dataclass(frozen=True)
class Alert:
    """One alert: ``signal > threshold`` held for ``hold``."""

    name: str
    signal: str
    threshold: float
    hold: str
    severity: str
    summary: str

    def rule(self) -> Obj:
        """The Prometheus rule (``alert``, ``expr``, ``for``, labels, annotations)."""
        return {"alert": self.name, "expr": f"{self.signal} > {self.threshold:g}", "for": self.hold,
                "labels": {"severity": self.severity}, "annotations": {"summary": self.summary}}


def alerts(names: Names, serving: Serving, queue_target: float, ttft_slo_s: float) -> list[Alert]:
    """The alerts of a deployment.

    Arguments:
        names: the deployment; serving: what serves (its queue; Triton: the frontend and KV-cache series);
        queue_target: waiting requests per replica the autoscaler aims at; ttft_slo_s: the p90 TTFT objective.
    """
    sel = selector(names)
    queue = Alert("TrtllmKitQueueBacklog", f"sum by (namespace, app, pod) ({waiting_series(names, serving)})",
                  QUEUE_FACTOR * queue_target, "5m", "warning",
                  f"{{{{ $labels.pod }}}} has had more than {QUEUE_FACTOR * queue_target:g} requests waiting for "
                  "5 minutes: the autoscaler is at its maximum or cannot start replicas.")
    if serving is not TRITON:
        return [queue]
    errors = f'sum by (namespace, app) (rate(trtllm_kit_openai_errors_total{{{sel},status=~"5.."}}[5m]))'
    requests = f"sum by (namespace, app) (rate(trtllm_kit_openai_requests_total{{{sel}}}[5m]))"
    ttft = (f"histogram_quantile({TTFT_QUANTILE:g}, sum by (namespace, app, le) "
            f"(rate(trtllm_kit_openai_time_to_first_token_seconds_bucket{{{sel}}}[5m])))")
    kv = f'max by (namespace, app, pod) (nv_trt_llm_kv_cache_block_metrics{{{sel},kv_cache_block_type="fraction"}})'
    return [
        queue,
        Alert("TrtllmKitErrorRate", f"{errors} / {requests}", ERROR_FRACTION, "5m", "critical",
              f"more than {ERROR_FRACTION:.0%} of {names.name}'s generation requests fail with a server error."),
        Alert("TrtllmKitTimeToFirstToken", ttft, ttft_slo_s, "10m", "warning",
              f"{names.name}'s p{TTFT_QUANTILE * 100:g} time to first token is above its objective of "
              f"{ttft_slo_s:g} s."),
        Alert("TrtllmKitKVCacheFull", kv, KV_CACHE_FULL, "5m", "warning",
              f"{{{{ $labels.pod }}}} has used more than {KV_CACHE_FULL:.0%} of its KV-cache blocks for 5 minutes: "
              "new requests wait for blocks."),
    ]
