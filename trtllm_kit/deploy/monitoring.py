"""The queries, said once: the autoscaler's signal, the recording rules and alerts (PrometheusRule), what is scraped
(PodMonitor).

Every series carries the serving pods' ``namespace`` and ``app`` labels (the PodMonitor copies ``app`` from the
pod), so one selector picks a deployment's series. The scaling signal is the C++ backend's queue gauge,
``nv_trt_llm_request_metrics{request_type="waiting"}``, summed over the replicas; the autoscaler divides it by
the replica count (``AverageValue``). NVIDIA's queue:compute ratio is recorded too, for the dashboard.
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.serving import TRITON, Serving

Obj = dict[str, Any]
WAITING = "nv_trt_llm_request_metrics"  # the C++ backend's request gauges (the kit's Python models too)
RULE_INTERVAL = "15s"
SCRAPE_INTERVAL = "5s"
RECORDED_PER_POD = "trtllm_kit:requests_waiting:per_pod"
ADAPTER_METRIC = "trtllm_kit_requests_waiting"


def selector(names: Names, **extra: str) -> str:
    """The label matchers of a deployment's series (plus ``extra``), without braces."""
    pairs = {"namespace": names.namespace, "app": names.name, **extra}
    return ",".join(f'{key}="{value}"' for key, value in pairs.items())


def waiting_series(names: Names, serving: Serving = TRITON) -> str:
    """The queue gauge of a deployment's serving pods, with its matchers."""
    return serving.queue(selector(names))


def waiting_query(names: Names, serving: Serving = TRITON) -> str:
    """The autoscaler's query: requests waiting in every replica's scheduler, summed. A queue whose series appear
    only after the first finished request reads 0 while the serving pods are scraped (``up == 1``), and nothing,
    which KEDA counts as a failed poll, while none is."""
    query = f"sum({waiting_series(names, serving)})"
    if serving.appears_late:
        query += f" or (0 * count(up{{{selector(names)}}} == 1))"
    return query


def load_query(names: Names) -> str:
    """Requests in the servers (running and waiting), summed: the load the signal is plotted against."""
    return f'sum({WAITING}{{{selector(names)},request_type=~"active|waiting"}})'


def recording_rules(names: Names, serving: Serving = TRITON) -> list[Obj]:
    """``record``/``expr`` pairs: the queue per deployment and per pod, and (Triton) KV-cache use and NVIDIA's
    queue:compute ratio."""
    sel = selector(names)
    waiting = waiting_series(names, serving)
    queue = [{"record": "trtllm_kit:requests_waiting:sum", "expr": f"sum by (namespace, app) ({waiting})"},
             {"record": RECORDED_PER_POD, "expr": f"sum by (namespace, pod) ({waiting})"}]
    if serving is not TRITON:
        return queue
    return [
        *queue,
        {"record": "trtllm_kit:kv_cache_used:fraction", "expr": "avg by (namespace, app) "
         f'(nv_trt_llm_kv_cache_block_metrics{{{selector(names, kv_cache_block_type="fraction")}}})'},
        {"record": "trtllm_kit:queue_compute:ratio", "expr": f"sum by (namespace, pod) "
         f"(rate(nv_inference_queue_duration_us{{{sel}}}[1m])) / clamp_min(sum by (namespace, pod) "
         f"(rate(nv_inference_compute_infer_duration_us{{{sel}}}[1m])), 1)"},
    ]


def _meta(names: Names, labels: dict[str, str]) -> Obj:
    """Metadata carrying ``labels`` too, which the Prometheus operator's rule and monitor selectors match."""
    meta = names.meta()
    meta["labels"].update(labels)
    return meta


def prometheus_rule(names: Names, labels: dict[str, str], serving: Serving = TRITON,
                    alert_rules: list[Obj] | None = None) -> Obj:
    """The PrometheusRule holding the recording rules and, in a group of their own, the alerts (``promtool check
    rules`` reads its ``spec``).

    Arguments:
        names: the deployment; labels: what the operator's ``ruleSelector`` matches (``monitor_labels``);
        serving: what serves (its queue series); alert_rules: ``alert`` rules (``deploy/alerts.py``), or none.
    """
    groups = [{"name": f"trtllm-kit-{names.name}", "interval": RULE_INTERVAL, "rules": recording_rules(names, serving)}]
    if alert_rules:
        groups.append({"name": f"trtllm-kit-{names.name}-alerts", "interval": RULE_INTERVAL, "rules": alert_rules})
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": _meta(names, labels),
            "spec": {"groups": groups}}


def pod_monitor(names: Names, labels: dict[str, str], serving: Serving = TRITON) -> Obj:
    """Scrape the serving pods only: Triton's metrics port and the OpenAI frontend's ``/metrics``, or
    ``trtllm-serve``'s ``/prometheus/metrics``.

    Arguments:
        names: the deployment; labels: what the operator's ``podMonitorSelector`` matches (``monitor_labels``);
        serving: what serves (its metrics endpoints).
    """
    endpoints = [{"port": port, "path": path, "interval": SCRAPE_INTERVAL} for port, path in serving.metrics]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _meta(names, labels),
            "spec": {"selector": {"matchLabels": names.serving}, "podMetricsEndpoints": endpoints,
                     "podTargetLabels": ["app"], "namespaceSelector": {"matchNames": [names.namespace]}}}


def adapter_rules() -> Obj:
    """prometheus-adapter Helm values exposing the per-pod queue as the custom metric the HPA reads."""
    return {"rules": {"custom": [{
        "seriesQuery": f'{RECORDED_PER_POD}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{RECORDED_PER_POD}$", "as": ADAPTER_METRIC},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"}]}}
