"""The Grafana dashboard of a Dynamo graph: the frontend's latency histograms and load gauges, the workers' KV use."""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.dashboard import Panel, dashboard_model
from trtllm_kit.deploy.dynamo_scaling import INFLIGHT, QUEUED
from trtllm_kit.deploy.monitoring import selector
from trtllm_kit.deploy.objects import Names

TTFT = "dynamo_frontend_time_to_first_token_seconds"
ITL = "dynamo_frontend_inter_token_latency_seconds"
KV_USAGE = "kvstats_gpu_cache_usage_percent"


def panels(names: Names) -> list[Panel]:
    """(title, unit, [(legend, query)]) of every panel."""
    sel = selector(names)

    def quantiles(metric: str) -> list[tuple[str, str]]:
        return [(f"p{q}", f"histogram_quantile(0.{q}, sum by (le) (rate({metric}_bucket{{{sel}}}[5m])))")
                for q in (50, 90, 99)]

    return [
        ("Time to first token (prefill pool)", "s", quantiles(TTFT)),
        ("Inter-token latency (decode pool)", "s", quantiles(ITL)),
        ("Requests at the frontend (autoscaler signals)", "short", [("queued", f"sum({QUEUED}{{{sel}}})"),
                                                                     ("in flight", f"sum({INFLIGHT}{{{sel}}})")]),
        ("KV-cache use by worker", "percent", [("{{pod}}", f"max by (pod) ({KV_USAGE}{{{sel}}})")]),
    ]


def dashboard(names: Names) -> dict[str, Any]:
    """The dashboard model for Grafana's import."""
    return dashboard_model(names, panels(names))
